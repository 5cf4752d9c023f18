"""Weights for rollout ranks that run ahead of the trainer (rollout.max_staleness >= 1).

In lockstep a rollout rank waits in `WeightSync.receive` for each version. Running ahead, it is
busy generating when a version is published, so the trainer leader first announces the version
with a small message (Tag.WEIGHTS), then enters the sync as before. A rollout rank looks for
announcements between engine batches, a turn boundary for every episode in flight, and joins the
sync when it finds one; the sync itself, whatever its transport, is unchanged. A stop is
announced the same way, so a rank that is generating still hears it.
"""

from __future__ import annotations

import time

from agentrl import transport
from agentrl.transport import Tag
from agentrl.weights.base import WeightSync


class AnnouncedWeights(WeightSync):
    """Trainer leader: announce each version (or the stop) to every rollout rank, then publish it with `inner`."""

    def __init__(self, inner: WeightSync, comm, rollout_ranks: list[int]):
        self.inner = inner
        self.comm = comm
        self.rollout_ranks = list(rollout_ranks)
        self._announcing: list = []

    def _announce(self, version: int | None) -> None:
        for request in self._announcing:  # long done: each is a few bytes
            transport.wait_sent(request, "a weight announcement")
        self._announcing = [transport.isend(self.comm, version, rank, Tag.WEIGHTS) for rank in self.rollout_ranks]

    def send(self, named_tensors, version: int) -> None:
        self._announce(version)
        self.inner.send(named_tensors, version)

    def stop(self) -> None:
        self._announce(None)
        self.inner.stop()

    def receive(self, engine) -> int | None:
        raise RuntimeError("AnnouncedWeights publishes from the trainer leader; rollout ranks use a WeightWatcher")


class WeightWatcher:
    """Rollout rank: takes announced versions into the engine when asked, or as soon as they come.

    `poll()` takes every version announced so far without waiting; `wait_for(version)` blocks until
    the engine holds `version` or newer. Both return False once the trainer announced a stop.
    `idle_s` sums the seconds spent waiting (for weights, or for a send to be taken)."""

    def __init__(self, sync: WeightSync, engine, comm, leader: int):
        self.sync = sync
        self.engine = engine
        self.comm = comm
        self.leader = leader
        self.stopped = False
        self.updates = 0
        self.idle_s = 0.0

    @property
    def version(self) -> int:
        return self.engine.weight_version

    def _take(self) -> None:
        announced, _ = transport.recv(self.comm, self.leader, Tag.WEIGHTS)
        received = self.sync.receive(self.engine)
        if announced is None or received is None:
            self.stopped = True
            return
        if received != announced:
            raise RuntimeError(f"weights of version {received} arrived where version {announced} was announced")
        self.updates += 1

    def _announced(self) -> bool:
        return transport.probe(self.comm, self.leader, Tag.WEIGHTS)

    def poll(self) -> bool:
        while not self.stopped and self._announced():
            self._take()
        return not self.stopped

    def wait_for(self, version: int) -> bool:
        started = time.perf_counter()
        while not self.stopped and self.version < version:
            transport.wait_until(self._announced, what=f"weights of version {version}")
            self._take()
        self.idle_s += time.perf_counter() - started
        return self.poll()

    def wait_sent(self, requests: list) -> bool:
        """Wait for sends to complete, taking announced weights meanwhile (the trainer may be publishing
        before it receives): False if a stop came (the sends still complete: the trainers drain them)."""
        started = time.perf_counter()
        transport.wait_until(lambda: (self.poll() or True) and all(r.test()[0] for r in requests), what="a batch send")
        self.idle_s += time.perf_counter() - started
        return not self.stopped
