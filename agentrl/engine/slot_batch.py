"""The continuous engine's running batch on a slot KV cache, for steps of fixed shapes (CUDA graphs).

Row i keeps its keys and values in slot i of one buffer, `kv` (2, layers, slots, kv heads,
columns, head_dim), left-aligned: column j holds its token at position j, so a row's
position is its length and a step writes each row's new columns at its own positions. A
row's whole cache, every layer's keys and values, is one strided view (`kv[:, :, i]`), so
storing it for a next turn, putting it back, and moving rows are one copy each. The
buffer, the steps' inputs and the rotary tables stay at fixed addresses until they grow
(`generation` counts the growths), which is what lets a captured step be replayed.

Rows leaving are filled in by the last rows (`RowsLeaving`), as in `RunningBatch`; rows
joining are prefilled straight into the slots after the last row (`DecodeGraphs.prefill`).
Slots past the last row are free, and a step padded to a bucket of rows writes its
padding rows there.
"""

from __future__ import annotations

import itertools

import torch

from agentrl.engine.kv_sessions import KVBlock
from agentrl.engine.running_batch import RowsLeaving
from agentrl.engine.sampling import RowSampling

# The smallest column capacity; it doubles whenever a row would outgrow it.
MIN_COLUMNS = 256
# The fewest slots kept (up to max_batch_size): fewer growths, each of which recaptures every graph.
MIN_SLOTS = 64
# The most new tokens a row of a captured prefill feeds; longer prefills run eagerly.
PREFILL_GRAPH_TOKENS = 64


def row_bucket(rows: int) -> int:
    """The batch size a step of `rows` rows runs at: powers of two up to 32, then multiples of 32."""
    if rows <= 32:
        return 1 << max(0, rows - 1).bit_length()
    return -(-rows // 32) * 32


def column_bucket(columns: int) -> int:
    """The columns a step's attention reads: a power of two, at least 64."""
    return max(64, 1 << max(0, columns - 1).bit_length())


def token_bucket(tokens: int) -> int:
    """The new tokens per row a prefill runs at: a power of two, at least 8."""
    return max(8, 1 << max(0, tokens - 1).bit_length())


class PrefillInputs:
    """A prefill's inputs, in one int64 buffer copied to the device at once: token ids and positions (rows,
    tokens), each row's slot and the index of its last real token (rows,). Views of the batch's fixed
    `prefill_buffer` where they fit (what a captured prefill reads), else of a buffer of their own."""

    def __init__(self, buffer: torch.Tensor, rows: int, tokens: int):
        size = rows * (2 * tokens + 2)
        if size > buffer.numel():
            buffer = torch.empty(size, dtype=torch.long, device=buffer.device)
        self.buffer = buffer[:size]
        grid = rows * tokens
        self.ids = self.buffer[:grid].view(rows, tokens)
        self.positions = self.buffer[grid : 2 * grid].view(rows, tokens)
        self.slots = self.buffer[2 * grid : 2 * grid + rows]
        self.last = self.buffer[2 * grid + rows :]

    def write(self, host: torch.Tensor) -> None:
        self.buffer.copy_(host, non_blocking=host.is_pinned())


class SlotBatch:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype, device, max_rows: int):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.max_rows = row_bucket(max_rows)
        self.kv = torch.zeros((2, layers, 0, kv_heads, 0, head_dim), dtype=dtype, device=self.device)
        self.keys: list[torch.Tensor] = []  # per layer, a view of `kv`: (slots, kv heads, columns, head_dim)
        self.values: list[torch.Tensor] = []
        self.tokens_in = torch.zeros(0, dtype=torch.long, device=self.device)  # a decode step's input tokens
        self.positions_buffer = torch.zeros(0, dtype=torch.long, device=self.device)
        self.prefill_buffer = torch.zeros(0, dtype=torch.long, device=self.device)  # `PrefillInputs` of captured sizes
        self.generation = 0  # bumped at every growth: what a captured step reads has moved
        self.clear()

    def clear(self) -> None:
        self.rows: list = []
        self.lengths: list[int] = []  # columns each row fills (its next position)
        self.logits: torch.Tensor | None = None
        self.sampling: RowSampling | None = None

    @property
    def slots(self) -> int:
        return self.kv.shape[2]

    @property
    def columns(self) -> int:
        return self.kv.shape[4]

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
        shape = (2, self.layers, slots, self.kv_heads, width, self.head_dim)
        grown = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if count:
            grown[:, :, :count, :, :used] = self.kv[:, :, :count, :, :used]
        self.kv = grown
        self.keys, self.values = list(grown[0].unbind(0)), list(grown[1].unbind(0))
        # A step's tokens are written before `DecodeGraphs.decode` reserves room for them: both inputs move along.
        tokens, positions = self.tokens_in, self.positions_buffer
        self.tokens_in = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.positions_buffer = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.tokens_in[: tokens.shape[0]] = tokens
        self.positions_buffer[: positions.shape[0]] = positions
        self.prefill_buffer = torch.zeros(slots * (2 * PREFILL_GRAPH_TOKENS + 2), dtype=torch.long, device=self.device)
        self.generation += 1

    def restore(self, slot: int, kv: torch.Tensor) -> None:
        """Put a row's stored cache (`stored_kv`) back, into the first columns of `slot`."""
        self.kv[:, :, slot, :, : kv.shape[3]].copy_(kv)

    def copy_slots(self, sources: list[int], targets: list[int], columns: int) -> None:
        """Slot `targets[i]` takes the first `columns` columns of slot `sources[i]` (rows sharing one prefill)."""
        source = torch.tensor(sources, dtype=torch.long, device=self.device)
        target = torch.tensor(targets, dtype=torch.long, device=self.device)
        self.kv[:, :, target, :, :columns] = self.kv[:, :, source, :, :columns]

    def join(self, rows: list, lengths: list[int], logits: torch.Tensor, sampling: RowSampling) -> None:
        """Append `rows`, prefilled into the slots after the last row: each fills `lengths` columns."""
        first = len(self.rows)
        self.positions_buffer[first : first + len(rows)] = torch.tensor(lengths, device=self.device)
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
            self.kv[:, :, moves.holes, :, :used] = self.kv[:, :, moves.movers, :, :used]
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

    def tail_block_bytes(self, indices: list[int], tokens: list[int]) -> list[int]:
        """For each i, the bytes `stored_kvs` of rows `indices[i:]` (`tokens` each) would take: their tokens, one
        after another."""
        token_bytes = self.token_bytes()
        return [total * token_bytes for total in itertools.accumulate(reversed(tokens))][::-1]

    def stored_kvs(self, indices: list[int], tokens: list[int]) -> KVBlock:
        """Rows `indices`' keys and values for their first `tokens[i]` tokens, one row after another, copied in one
        gather; its views (2, layers, kv heads, tokens, dim)."""
        row_index = torch.repeat_interleave(torch.tensor(indices), torch.tensor(tokens)).to(self.device)
        column_index = torch.tensor([column for count in tokens for column in range(count)], device=self.device)
        block = self.kv[:, :, row_index, :, column_index]  # (all tokens, 2, layers, kv heads, dim)
        nbytes = block.numel() * block.element_size()
        return KVBlock(nbytes, lambda start, count: block[start : start + count].permute(1, 2, 3, 0, 4))

    def token_bytes(self) -> int:
        """Bytes of one token's keys and values over all layers."""
        return self.kv[:, :, 0, :, 0].numel() * self.kv.element_size()
