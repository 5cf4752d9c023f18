"""KV caches kept between an episode's turns, found again by token prefix, evicted under a memory budget.

When a request finishes, the continuous torch engine stores the keys and values of every
token it computed (prompt and output but the last sampled token) with those tokens. The
episode's next turn sends the whole conversation again: its token ids start with the
stored ones, so the engine takes the stored cache and prefills only the rest (the closing
token and the observation). Matching by tokens, not by an episode key, needs nothing from
the caller (SGLang's radix cache behaves the same way) and can never pair a cache with
tokens it was not computed from.

Rows that finish together are stored with one copy (`put_block`): their entries share one
block of memory, counted against the budget from the first entry stored until the last one
leaves (taken or evicted). Entries carry the weight version they were computed under; a new
version empties the store. Least recently stored entries go first when the budget is exceeded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Entries are bucketed by their first tokens; a lookup compares only the entries of its bucket
# (and the few entries shorter than that, kept under the key of all they have).
BUCKET_TOKENS = 8


@dataclass(eq=False)
class KVBlock:
    """Memory holding the KV of one or more entries' tokens: `nbytes`, counted while any of its `entries` is stored;
    `view(start, count)`, the KV of the entry at `start` (its `count` tokens), as an entry's `kv`.

    Entries lie one after another (`start`: where an entry's tokens begin), or, where `rows` is set, one a row
    (`start`: the entry's row): the running batch's own layout, which the next admission copies whole rows of."""

    nbytes: int
    view: Callable[[int, int], list[tuple[torch.Tensor, torch.Tensor]] | torch.Tensor]
    entries: int = 0
    rows: RowsKV | None = None


@dataclass(frozen=True)
class RowsKV:
    """Keys and values of rows as the continuous engine's running batch holds them: per layer (keys, values), each
    (rows, heads, columns, dim), and `mask` (rows, columns), True where a column holds one of the row's tokens."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor


@dataclass
class KVEntry:
    tokens: list[int]
    version: int
    block: KVBlock
    start: int = 0  # where the entry's tokens begin in its block

    @property
    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]] | torch.Tensor:
        """As the batch that stored it keeps a row's cache: per layer (keys, values), each (1, heads, len(tokens),
        dim), from `RunningBatch`; one (2, layers, heads, len(tokens), dim) tensor from `SlotBatch`. Views made
        when asked for: most entries are never taken."""
        return self.block.view(self.start, len(self.tokens))


class KVSessionStore:
    """Finished requests' KV caches, looked up by the longest stored token prefix of a new prompt."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self.nbytes = 0
        self.evictions = 0
        self._entries: OrderedDict[int, KVEntry] = OrderedDict()
        self._buckets: dict[tuple[int, ...], set[int]] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]] | torch.Tensor, version: int) -> None:
        """Store one entry whose `kv` tensors are its own memory."""
        tensors = [kv] if isinstance(kv, torch.Tensor) else [tensor for pair in kv for tensor in pair]
        nbytes = sum(tensor.numel() * tensor.element_size() for tensor in tensors)
        self.put_block([tokens], KVBlock(nbytes, lambda start, count: kv), version)

    def put_block(self, entries: list[list[int]], block: KVBlock, version: int) -> None:
        """Store entries of these tokens, whose KV lie one after another in `block`; nothing if the block alone
        exceeds the budget (the caller stores fewer rows)."""
        if not entries or not all(entries) or block.nbytes > self.budget_bytes:
            return
        while self._entries and self.nbytes + block.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        block.entries, start = len(entries), 0
        for row, tokens in enumerate(entries):
            entry_id, self._next_id = self._next_id, self._next_id + 1
            self._entries[entry_id] = KVEntry(list(tokens), version, block, row if block.rows is not None else start)
            self._buckets.setdefault(tuple(tokens[:BUCKET_TOKENS]), set()).add(entry_id)
            start += len(tokens)
        self.nbytes += block.nbytes

    def take(self, prompt: list[int], version: int) -> KVEntry | None:
        """Remove and return the entry whose tokens are the longest proper prefix of `prompt`, if any.

        Proper: at least one prompt token is left to prefill, which gives the logits of the first new token.
        """
        best_id, best_len = None, 0
        candidates = [self._buckets.get(tuple(prompt[:BUCKET_TOKENS]), ())]
        candidates += [self._buckets.get(tuple(prompt[:n]), ()) for n in range(1, min(BUCKET_TOKENS, len(prompt)))]
        for entry_id in (entry_id for bucket in candidates for entry_id in bucket):
            tokens = self._entries[entry_id].tokens
            n = len(tokens)
            if best_len < n < len(prompt) and prompt[n - 1] == tokens[-1] and prompt[:n] == tokens:
                best_id, best_len = entry_id, n
        if best_id is None:
            return None
        entry = self._drop(best_id)
        return entry if entry.version == version else None

    def clear(self) -> None:
        self._entries.clear()
        self._buckets.clear()
        self.nbytes = 0

    def _drop(self, entry_id: int) -> KVEntry:
        entry = self._entries.pop(entry_id)
        bucket_key = tuple(entry.tokens[:BUCKET_TOKENS])
        bucket = self._buckets[bucket_key]
        bucket.discard(entry_id)
        if not bucket:
            del self._buckets[bucket_key]
        entry.block.entries -= 1
        if not entry.block.entries:
            self.nbytes -= entry.block.nbytes
        return entry
