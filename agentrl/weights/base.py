"""Versioned weight sync from the trainer leader to rollout engines, in buckets.

A sync is: a small header (version, tensor manifest, bucket boundaries), then one
broadcast per bucket of raw bytes. Bytes, not a numeric dtype, so bf16 travels as is.
`WeightSync` is the transport interface: the CPU path broadcasts over MPI; a GPU path
(NCCL broadcast, CUDA IPC) implements the same three methods. A header with `stop` set
and no buckets tells the rollout ranks to stop instead (see agentrl/run/preempt.py).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np
import torch

from agentrl import transport

# Once a version's header has arrived its buckets follow at once: poll them closely (MPICH
# progresses a non-blocking broadcast only inside MPI calls, so long sleeps stall it).
TRANSFER_MAX_SLEEP_S = 2e-4

TensorSpec = tuple[str, tuple[int, ...], str]  # name, shape, dtype name ("bfloat16"): a manifest's entry


def tensor_spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    return name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")


def spec_nbytes(spec: TensorSpec) -> int:
    """The bytes of the tensor a manifest entry describes."""
    _, shape, dtype = spec
    return int(np.prod(shape, dtype=np.int64)) * getattr(torch, dtype).itemsize


class WeightSync(abc.ABC):
    @abc.abstractmethod
    def send(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Trainer leader: publish these weights as `version`."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Trainer leader: tell the receivers no more weights will come (their `receive` returns None)."""

    @abc.abstractmethod
    def receive(self, engine) -> int | None:
        """Rollout rank: load the next published weights into `engine`; the version, or None when told to stop."""

    def place(self, model) -> None:  # noqa: B027 - optional hook, nothing to do for most transports
        """Trainer leader, before its first send: the sync may keep `model`'s parameters where it publishes from."""

    def begin_update(self) -> None:  # noqa: B027 - optional hook
        """Trainer leader: its optimizer is about to change the weights it sent last."""

    def paces_sender(self) -> bool:
        """Rollout rank: whether the trainer's `send` may wait until this rank has received, so that a rank running
        ahead should start receiving as soon as a version is announced, not at its engine's next batch."""
        return True


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[tuple[int, int]]:
    """[start, end) tensor index ranges whose byte sizes add up to at most bucket_bytes (one oversized tensor alone)."""
    buckets, start, filled = [], 0, 0
    for index, size in enumerate(sizes):
        if filled and filled + size > bucket_bytes:
            buckets.append((start, index))
            start, filled = index, 0
        filled += size
    if start < len(sizes):
        buckets.append((start, len(sizes)))
    return buckets


def full_tensors(named_tensors) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) one at a time; a sharded DTensor (FSDP2) is gathered only when its turn comes.

    Gathering is a collective: every trainer rank must walk the same list in the same order.
    """
    for name, tensor in named_tensors:
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


class GatherOnly(WeightSync):
    """Non-leader trainer ranks under FSDP: join each parameter's gather in the leader's order, send nothing.

    Gathering a DTensor is a collective over the trainer group, so while the leader walks
    its buckets every other trainer rank must walk the same tensors in the same order.
    """

    def send(self, named_tensors, version: int) -> None:
        for _name, _tensor in full_tensors(named_tensors):
            pass  # the gathered copy is dropped at once

    def stop(self) -> None:
        """Nothing to tell: the leader tells the rollout ranks."""

    def receive(self, engine) -> int | None:
        raise RuntimeError("GatherOnly is for trainer ranks, which never receive weights; rollout ranks need a sync")


class InProcessWeightCopy(WeightSync):
    """Single-process mode and hybrid ranks: the engine copies straight from the trainer's tensors (sharded ones,
    FSDP2 on hybrid ranks, gathered whole: a collective every rank joins with its own engine)."""

    def __init__(self, engine):
        self.engine = engine

    def send(self, named_tensors, version: int) -> None:
        self.engine.load_weights(full_tensors(named_tensors), version)

    def stop(self) -> None:
        """Nothing to tell: the rollout worker runs in this process."""

    def receive(self, engine) -> int | None:
        return engine.weight_version


def receive_buckets(comm, engine, load_bucket) -> int | None:
    """A rollout rank's side of a bucketed sync: the header from the trainer leader, then `load_bucket(specs)`
    for each bucket's (name, shape, dtype) specs inside one engine update; the version, or None when told to stop."""
    header = transport.bcast_object(comm, None, root=0)
    if header["stop"]:
        return None
    manifest = header["manifest"]
    engine.begin_weight_update()
    for start, end in header["buckets"]:
        load_bucket(manifest[start:end])
    engine.end_weight_update(header["version"])
    return header["version"]
