"""Task sources: where each episode's task comes from, behind one interface.

    source.take(step, indices) -> [Task(id, seed, options), ...]     # env.reset(seed=task.seed, options=task.options)

`SeededTasks` is the env's own task generator: a seed per (run seed, step, task index) and no
options. `DatasetTasks` serves dataset rows (options=row): the rows of each epoch are shuffled
from the run seed and the epoch number, dealt round-robin to the rollout ranks (rank r gets
every R-th row of the epoch's order), and each rank walks its share with a counter of rows
consumed. That counter is the data position a checkpoint keeps; extra rounds of dynamic
sampling simply consume more rows. With dynamic dispatch (agentrl/rollout/dispatch.py) one counter
serves every rank: the dispatcher `reserve`s positions and each rank builds its tasks with `at`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Protocol

import numpy as np

ID_COLUMN = "id"
SHUFFLE_STREAM = 2**32 + 7  # keeps the epoch shuffles apart from the task and engine seed streams
# a dataset of at most this many bytes in Arrow keeps the rows it has served as Python objects, and serves copies of
# them (reading a few rows from Arrow costs about as much as a one-turn episode's reward)
DECODED_ROWS_MAX_BYTES = 32 * 2**20
PLAIN = (str, int, float, bool, bytes, type(None))


@dataclass(frozen=True)
class Task:
    id: str  # the row's `id` column, else its index in the dataset; for seeded tasks, the seed
    seed: int
    options: dict | None = None


class TaskSource(Protocol):
    def take(self, step: int, indices: list[int]) -> list[Task]:
        """The tasks of `indices` (task indices within `step`, see rollout/worker.py task_index), in order."""

    def reserve(self, count: int) -> list[int | None]:
        """Consume the next `count` data positions (None for sources without positions)."""

    def at(self, step: int, index: int, position: int | None) -> Task:
        """The task of `index` within `step` served from data `position` (from `reserve`, maybe on another rank)."""

    def position(self) -> dict | None:
        """What a checkpoint keeps to continue where this source stopped (None: nothing to keep)."""

    def stats(self) -> dict[str, float]:
        """Scalars logged each step (dataset sources: `data/epoch`)."""


def task_seed(seed: int, step: int, task: int) -> int:
    return int(np.random.SeedSequence([seed, step, task]).generate_state(1)[0])


class SeededTasks:
    """The env generates each task from its seed: one per (run seed, step, task index)."""

    def __init__(self, seed: int):
        self.seed = seed

    def take(self, step: int, indices: list[int]) -> list[Task]:
        return [self.at(step, index, None) for index in indices]

    def reserve(self, count: int) -> list[None]:
        return [None] * count

    def at(self, step: int, index: int, position: None) -> Task:
        seed = task_seed(self.seed, step, index)
        return Task(str(seed), seed)

    def position(self) -> None:
        return None

    def stats(self) -> dict[str, float]:
        return {}


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Every row index once, in epoch `epoch`'s order (the same on every rank)."""
    if not shuffle:
        return np.arange(size)
    return np.random.default_rng(np.random.SeedSequence([seed, SHUFFLE_STREAM, epoch])).permutation(size)


def shard_size(size: int, shard: int, shards: int) -> int:
    return len(range(shard, size, shards))


class DatasetTasks:
    """Rows of a dataset, this rank's share of each epoch in shuffled order; `consumed` rows already served."""

    def __init__(self, rows, source: str, seed: int, shard: int, shards: int, consumed: int = 0, shuffle=True):
        self.rows, self.source, self.seed = rows, source, seed
        self.shard, self.shards, self.shuffle = shard, shards, shuffle
        self.size = len(rows)
        self.shard_size = shard_size(self.size, shard, shards)
        if self.shard_size == 0:
            raise ValueError(f"{source} has {self.size} rows, fewer than the {shards} rollout ranks")
        self.consumed = consumed
        self._epoch, self._order = -1, np.zeros(0, np.int64)
        self.has_ids = ID_COLUMN in rows.column_names
        self._decoded: dict[int, dict] | None = {} if rows.data.nbytes <= DECODED_ROWS_MAX_BYTES else None

    def row_index(self, position: int) -> int:
        """The dataset index of this rank's `position`-th row (counted over all epochs)."""
        epoch, offset = divmod(position, self.shard_size)
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = epoch_order(self.size, self.seed, epoch, self.shuffle)[self.shard :: self.shards]
        return int(self._order[offset])

    def take(self, step: int, indices: list[int]) -> list[Task]:
        positions = self.reserve(len(indices))
        row_indices = [self.row_index(position) for position in positions]
        return [
            self._task(step, index, row_index, row)
            for index, row_index, row in zip(indices, row_indices, self._rows_at(row_indices), strict=True)
        ]

    def _rows_at(self, row_indices: list[int]) -> list[dict]:
        """The rows at `row_indices`, each a new object (an env may change what it is given)."""
        if self._decoded is None:
            return self._read(row_indices)
        missing = [index for index in dict.fromkeys(row_indices) if index not in self._decoded]
        if missing:
            self._decoded.update(zip(missing, self._read(missing), strict=True))
        return [fresh_copy(self._decoded[index]) for index in row_indices]

    def _read(self, row_indices: list[int]) -> list[dict]:
        """The rows at `row_indices`, read together: a Hugging Face dataset reads 8 rows in about the time of two."""
        if not row_indices:
            return []
        columns = self.rows[row_indices]
        names = list(columns)
        return [dict(zip(names, values, strict=True)) for values in zip(*(columns[n] for n in names), strict=True)]

    def reserve(self, count: int) -> list[int]:
        positions = list(range(self.consumed, self.consumed + count))
        self.consumed += count
        return positions

    def at(self, step: int, index: int, position: int) -> Task:
        row_index = self.row_index(position)
        return self._task(step, index, row_index, self._rows_at([row_index])[0])

    def _task(self, step: int, index: int, row_index: int, row: dict) -> Task:
        row_id = row.get(ID_COLUMN) if self.has_ids else None
        return Task(str(row_index if row_id is None else row_id), task_seed(self.seed, step, index), row)

    def position(self) -> dict:
        return {"consumed": self.consumed, "rows": self.size}

    def stats(self) -> dict[str, float]:
        return {"data/epoch": self.consumed / self.shard_size}


def fresh_copy(value):
    """A copy of a row's value as datasets decode it: new dicts and lists, the same immutable leaves."""
    if isinstance(value, dict):
        return {key: fresh_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [fresh_copy(item) for item in value]
    return value if isinstance(value, PLAIN) else copy.deepcopy(value)


def resume_positions(saved: dict | None, size: int, shards: int) -> tuple[list[int], str | None]:
    """Each rollout rank's rows consumed when a run resumes from a checkpoint's data state, and a note when the
    exact position cannot be kept (the rollout ranks or the dataset changed): then the run starts the next
    epoch, so no row of the unfinished one repeats."""
    if saved is None:
        return [0] * shards, None
    consumed = saved["consumed"]
    if saved["rows"] == size and len(consumed) == shards:
        return list(consumed), None
    old_sizes = [shard_size(saved["rows"], shard, len(consumed)) for shard in range(len(consumed))]
    epoch = max(-(-count // old) for count, old in zip(consumed, old_sizes, strict=True))
    note = (
        f"the checkpoint's data position is for {len(consumed)} rollout rank(s) over {saved['rows']} rows, this run "
        f"has {shards} over {size}: starting data epoch {epoch} from its beginning"
    )
    return [epoch * shard_size(size, shard, shards) for shard in range(shards)], note
