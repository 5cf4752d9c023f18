"""The continuous engine's running batch: its rows, their KV cache, mask, next positions, logits and sampling settings.

Rows leaving are filled in by the last rows (`RowsLeaving`), so few rows move.
Rows joining are written after the last row, into spare rows the KV buffers keep for them:
only the joining rows are copied, not the cache, unless they outgrow the spare rows or are
wider than the batch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from agentrl.engine.kv_sessions import KVBlock, RowsKV
from agentrl.engine.lean_decoder import COLUMN_HEADROOM
from agentrl.engine.sampling import RowSampling


class RunningBatch:
    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.rows: list = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # bool (rows, cache width): True where a column holds the row's token
        self.positions: torch.Tensor | None = None  # (rows,), position of each row's next token
        self.logits: torch.Tensor | None = None  # (rows, vocab), the next token's logits
        self.sampling: RowSampling | None = None

    def leave(self, leaving: list[bool]) -> torch.Tensor | None:
        """Drop the rows marked in `leaving`; return which old row each row left is (None: no row is left)."""
        if all(leaving):
            self.clear()
            return None
        moves = RowsLeaving(leaving, self.mask.device)
        keep = moves.index
        self.rows = [self.rows[row] for row in moves.order]
        for layer in self.cache.layers:
            layer.keys, layer.values = keep_rows(layer.keys, moves), keep_rows(layer.values, moves)
        self.mask = self.mask[keep]
        self.positions = self.positions[keep]
        self.logits = self.logits[keep]
        self.sampling.select(keep, moves.order)
        first = int(self.mask.any(dim=0).int().argmax())
        if first > 0:  # columns only departed rows used
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]
        return keep

    def token_bytes(self) -> int:
        """Bytes of one token's keys and values over all layers."""
        return sum(2 * layer.keys[0, :, 0].numel() * layer.keys.element_size() for layer in self.cache.layers)

    def tail_block_bytes(self, indices: list[int], tokens: list[int]) -> list[int]:
        """For each i, the bytes `stored_kvs` of rows `indices[i:]` would take: every row as wide as the columns
        any of them uses (their padding and holes counted, so at least `tokens`)."""
        used = self.mask[torch.tensor(indices, device=self.mask.device)].cpu().numpy()
        first = used.argmax(axis=1)
        end = used.shape[1] - used[:, ::-1].argmax(axis=1)
        lows, highs = np.minimum.accumulate(first[::-1])[::-1], np.maximum.accumulate(end[::-1])[::-1]
        count = np.arange(len(indices), 0, -1)
        return (count * (highs - lows) * self.token_bytes()).tolist()

    def stored_kvs(self, indices: list[int], tokens: list[int]) -> KVBlock:
        """Rows `indices`' keys and values (`tokens[i]`: the tokens each holds) copied in the batch's own layout
        (`RowsKV`), one gather per tensor, without the columns none of them uses."""
        index = torch.tensor(indices, device=self.mask.device)
        mask = self.mask[index]
        assert mask.sum(dim=1).tolist() == list(tokens), tokens
        used = mask.any(dim=0).nonzero()[:, 0]
        first, last = int(used[0]), int(used[-1]) + 1
        layers = [
            tuple(kept[..., first:last, :].index_select(0, index) for kept in (layer.keys, layer.values))
            for layer in self.cache.layers
        ]
        rows = RowsKV(layers, mask[:, first:last])

        def view(row: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            columns = rows.mask[row].nonzero()[:, 0]
            return [tuple(kept[row : row + 1, :, columns] for kept in layer) for layer in rows.layers]

        nbytes = sum(tensor.numel() * tensor.element_size() for pair in layers for tensor in pair)
        return KVBlock(nbytes, view, rows=rows)

    def join(self, rows: list, cache: DynamicCache, mask: torch.Tensor, positions, logits, sampling) -> None:
        """Append prefilled `rows`: their KV `cache` (right-aligned, as wide as their `mask`), mask, next
        positions, logits and sampling settings."""
        mask = mask.bool()
        if not self.rows:
            self.rows, self.cache, self.mask, self.positions, self.logits = rows, cache, mask, positions, logits
            self.sampling = sampling
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys = append_rows(old.keys, new.keys, width)
            old.values = append_rows(old.values, new.values, width)
        self.mask = torch.cat([_left_pad(self.mask, width), _left_pad(mask, width)])
        self.rows = self.rows + rows
        self.positions = torch.cat([self.positions, positions])
        self.logits = torch.cat([self.logits, logits])
        self.sampling.extend(sampling)


def append_rows(kept: torch.Tensor, new: torch.Tensor, width: int) -> torch.Tensor:
    """`kept` (rows, heads, columns, dim) and `new` (rows, heads, its columns, dim) one above the other,
    right-aligned to `width` columns, zeros on the left.

    `new` is written into the spare rows of `kept`'s buffer where it has them and `width` is
    `kept`'s own; otherwise both go into a new buffer with a quarter more rows (at least 8)
    and COLUMN_HEADROOM more columns to spare."""
    rows, heads, columns, dim = kept.shape
    added = new.shape[0]
    grown = _view_with_rows(kept, added) if width == columns else None
    if grown is None:
        spare = max(8, (rows + added) // 4)
        buffer = kept.new_empty((rows + added + spare, heads, width + COLUMN_HEADROOM, dim))
        buffer[:rows, :, : width - columns] = 0
        buffer[:rows, :, width - columns : width] = kept
        grown = buffer[: rows + added, :, :width]
    grown[rows:, :, : width - new.shape[2]] = 0
    grown[rows:, :, width - new.shape[2] :] = new
    return grown


class RowsLeaving:
    """Which rows stay when some leave, and how they move up: each departed row among the
    first `count` rows takes a staying row from past them, so few rows move.

    `order[i]` is the old row that new row i holds; apply it to every per-row tensor, and
    `keep_rows` to the KV buffers.
    """

    def __init__(self, leaving: list[bool], device: torch.device | str = "cpu"):
        staying = [row for row, gone in enumerate(leaving) if not gone]
        self.count = len(staying)
        holes = [row for row in range(self.count) if leaving[row]]
        movers = staying[len(staying) - len(holes) :]
        self.order = list(range(self.count))
        for hole, mover in zip(holes, movers, strict=True):
            self.order[hole] = mover
        self.index = torch.tensor(self.order, device=device)
        self.holes = torch.tensor(holes, dtype=torch.long, device=device)
        self.movers = torch.tensor(movers, dtype=torch.long, device=device)


def keep_rows(kept: torch.Tensor, leaving: RowsLeaving) -> torch.Tensor:
    """`kept` with only the staying rows, in `leaving.order`, moved within its own buffer so the room after
    its columns stays."""
    if len(leaving.holes):
        kept[leaving.holes] = kept[leaving.movers]
    return kept[: leaving.count]


def _view_with_rows(kept: torch.Tensor, added: int) -> torch.Tensor | None:
    """`kept` grown by `added` rows within its buffer, or None if the buffer has no room for them.

    Rows past a view's last are the buffer's spare rows (or rows that left): no other tensor looks at them."""
    rows = kept.shape[0]
    last = kept.storage_offset() + (rows + added - 1) * kept.stride(0)
    end = last + sum((size - 1) * stride for size, stride in zip(kept.shape[1:], kept.stride()[1:], strict=True)) + 1
    if end * kept.element_size() > kept.untyped_storage().nbytes():
        return None
    return kept.as_strided((rows + added, *kept.shape[1:]), kept.stride(), kept.storage_offset())


def _left_pad(mask: torch.Tensor, width: int) -> torch.Tensor:
    return mask if mask.shape[1] == width else F.pad(mask, (width - mask.shape[1], 0))
