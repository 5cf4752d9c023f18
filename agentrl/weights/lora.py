"""Adapter-only syncs, confirmed: every engine reports the version and checksum of the adapters it merged.

With `model.lora` the trainer sends only the adapter tensors (agentrl/trainer/lora.py names them) through
the job's own CPU transport (mpi or shm), and the torch engine merges them into its base weights
(agentrl/engine/lora_merge.py). After each version every member of the weight group gives its view in one
allgather: the trainer leader the version and the crc32 of the adapters it sent, each rollout rank the
version its engine holds and the crc32 of the adapters it merged. Any difference raises `StaleWeights` on
every rank, naming the rank and what it holds, so the run stops instead of training on episodes from weights
that did not arrive.
"""

from __future__ import annotations

import zlib

import torch

from agentrl import transport
from agentrl.weights.base import WeightSync, full_tensors


def adapter_checksum(named_tensors) -> int:
    """crc32 over every tensor's name and bytes, in name order: the same on the trainer and on each engine."""
    checksum = 0
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        checksum = zlib.crc32(name.encode(), checksum)
        data = tensor.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy()
        checksum = zlib.crc32(memoryview(data), checksum)
    return checksum


class StaleWeights(RuntimeError):
    """A rollout engine does not hold the adapters the trainer just sent."""


def check_reports(reports: list[tuple]) -> None:
    """`reports[0]`: the leader's (version, checksum); then each rollout rank's (version, checksum). Raises on any
    difference, naming every rank that differs."""
    version, checksum = reports[0]
    wrong = [
        f"rollout rank {index} (weight-group rank {index + 1}) holds version {got_version} with adapter checksum "
        f"{got_checksum}"
        for index, (got_version, got_checksum) in enumerate(reports[1:])
        if (got_version, got_checksum) != (version, checksum)
    ]
    if wrong:
        raise StaleWeights(
            f"the trainer sent LoRA adapters of version {version} (checksum {checksum}), but " + "; ".join(wrong) + ". "
            "The sync did not arrive intact, so the run stops rather than train on stale weights; check the weight "
            "transport (weights.transport=mpi rules out shared memory) and that every rank runs the same config"
        )


class ConfirmedAdapterSync(WeightSync):
    """Wraps the job's transport: sends or receives as it does, then the confirmation round over `comm`."""

    def __init__(self, inner: WeightSync, comm):
        self.inner = inner
        self.comm = comm
        self.bytes_sent = 0  # the last version's adapter bytes (what bench_lora reports)

    def place(self, model) -> None:
        self.inner.place(model)

    def begin_update(self) -> None:
        self.inner.begin_update()

    def send(self, named_tensors, version: int) -> None:
        named_tensors = list(full_tensors(named_tensors))  # under FSDP, gathered once (GatherOnly's one walk): small
        self.bytes_sent = sum(t.numel() * t.element_size() for _, t in named_tensors)
        self.inner.send(named_tensors, version)
        check_reports(transport.allgather_object(self.comm, (version, adapter_checksum(named_tensors))))

    def stop(self) -> None:
        self.inner.stop()

    def receive(self, engine) -> int | None:
        version = self.inner.receive(engine)
        if version is None:
            return None
        check_reports(transport.allgather_object(self.comm, (engine.weight_version, engine.loaded_checksum)))
        return version
