"""The continuous engine's running batch on a slot KV cache, for decode steps of fixed shapes (CUDA graphs).

Row i keeps its keys and values in slot i of one buffer per layer, (slots, kv heads,
columns, head_dim), left-aligned: column j holds its token at position j, so a row's
position is its length and a decode step writes each row's new column at its own
position. The buffers, the step's token and position inputs stay at fixed addresses until
they grow (`generation` counts the growths), which is what lets a captured decode step be
replayed step after step.

Rows leaving are filled in by the last rows (`RowsLeaving`), as in `RunningBatch`; rows
joining go into the slots after the last row. Slots past the last row are free, and a
decode step padded to a batch-size bucket writes its padding rows there.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from agentrl.engine.running_batch import RowsLeaving
from agentrl.engine.sampling import RowSampling

# The smallest column capacity; it doubles whenever a row would outgrow it.
MIN_COLUMNS = 256
# The fewest slots kept (up to max_batch_size): fewer growths, each of which recaptures every graph.
MIN_SLOTS = 64


def row_bucket(rows: int) -> int:
    """The batch size a step of `rows` rows runs at: powers of two up to 32, then multiples of 32."""
    if rows <= 32:
        return 1 << max(0, rows - 1).bit_length()
    return -(-rows // 32) * 32


def column_bucket(columns: int) -> int:
    """The columns a step's attention reads: a power of two, at least 64."""
    return max(64, 1 << max(0, columns - 1).bit_length())


class SlotBatch:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype, device, max_rows: int):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.max_rows = row_bucket(max_rows)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.tokens_in = torch.zeros(0, dtype=torch.long, device=self.device)  # a decode step's input tokens
        self.positions_buffer = torch.zeros(0, dtype=torch.long, device=self.device)
        self.generation = 0  # bumped at every growth: what a captured step reads has moved
        self.clear()

    def clear(self) -> None:
        self.rows: list = []
        self.lengths: list[int] = []  # columns each row fills (its next position)
        self.logits: torch.Tensor | None = None
        self.sampling: RowSampling | None = None

    @property
    def slots(self) -> int:
        return self.tokens_in.shape[0]

    @property
    def columns(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, rows: int, columns: int) -> None:
        """Room for `rows` rows of `columns` columns; growing moves every buffer (a new generation)."""
        if rows <= self.slots and columns <= self.columns:
            return
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows do not fit the engine's {self.max_rows} slots")
        slots = max(self.slots, min(self.max_rows, max(MIN_SLOTS, row_bucket(rows))))
        width = max(self.columns, MIN_COLUMNS)
        while width < columns:
            width *= 2
        count, used = len(self.rows), max(self.lengths, default=0)
        shape = (slots, self.kv_heads, width, self.head_dim)
        for buffers in (self.keys, self.values):
            for layer in range(self.layers):
                grown = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if count:
                    grown[:count, :, :used] = buffers[layer][:count, :, :used]
                if layer < len(buffers):
                    buffers[layer] = grown
                else:
                    buffers.append(grown)
        # A step's tokens are written before `DecodeGraphs.decode` reserves room for them: both inputs move along.
        tokens, positions = self.tokens_in, self.positions_buffer
        self.tokens_in = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.positions_buffer = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.tokens_in[: tokens.shape[0]] = tokens
        self.positions_buffer[: positions.shape[0]] = positions
        self.generation += 1

    def join(self, rows: list, cache: DynamicCache, mask: torch.Tensor, positions, logits, sampling) -> None:
        """Append prefilled `rows`: their KV `cache` (right-aligned, with holes where `mask` is 0), mask, next
        positions, logits and sampling settings. Each row's real columns go to its slot's first columns."""
        mask = mask.bool()
        lengths = mask.sum(dim=1).tolist()
        first, added, widest = len(self.rows), len(rows), max(lengths)
        self.reserve(first + added, widest + 1)
        # The real columns of each row first, in order: a stable sort of "is padding".
        order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices[:, :widest]
        index = order[:, None, :, None].expand(added, self.kv_heads, widest, self.head_dim)
        for layer, kept in enumerate(cache.layers):
            self.keys[layer][first : first + added, :, :widest] = kept.keys.gather(2, index)
            self.values[layer][first : first + added, :, :widest] = kept.values.gather(2, index)
        self.positions_buffer[first : first + added] = positions
        self.rows = self.rows + rows
        self.lengths = self.lengths + lengths
        self.logits = logits if self.logits is None or not first else torch.cat([self.logits, logits])
        if self.sampling is None or not first:
            self.sampling = sampling
        else:
            self.sampling.extend(sampling)

    def leave(self, leaving: list[bool]) -> torch.Tensor | None:
        """Drop the rows marked in `leaving`; return which old row each row left is (None: no row is left)."""
        if all(leaving):
            self.clear()
            return None
        moves = RowsLeaving(leaving, self.device)
        if len(moves.holes):
            used = max(self.lengths[old] for new, old in enumerate(moves.order) if old != new)
            for buffer in (*self.keys, *self.values):
                buffer[moves.holes, :, :used] = buffer[moves.movers, :, :used]
        keep = moves.index
        self.positions_buffer[: moves.count] = self.positions_buffer[keep]
        self.rows = [self.rows[row] for row in moves.order]
        self.lengths = [self.lengths[row] for row in moves.order]
        self.logits = self.logits[keep]
        self.sampling.select(keep, moves.order)
        return keep

    def advance(self) -> None:
        """Every row was fed one more token."""
        self.positions_buffer[: len(self.rows)] += 1
        self.lengths = [length + 1 for length in self.lengths]

    def stored_kv(self, index: int, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of row `index`'s keys and values for its first `tokens` tokens, per layer (1, heads, tokens, dim)."""
        return [
            (keys[index : index + 1, :, :tokens].clone(), values[index : index + 1, :, :tokens].clone())
            for keys, values in zip(self.keys, self.values, strict=True)
        ]
