"""The CPU path of last resort: a bucketed broadcast over MPI to every rollout rank (`weights.transport=mpi`)."""

from __future__ import annotations

import numpy as np
import torch

from agentrl import transport
from agentrl.weights.base import (
    TRANSFER_MAX_SLEEP_S,
    WeightSync,
    _flat_bytes,
    full_tensors,
    plan_buckets,
    receive_buckets,
)


class MPIWeightBroadcast(WeightSync):
    """CPU path: bucketed `Ibcast` over the weight communicator (root 0 = trainer leader)."""

    def __init__(self, comm, bucket_mb: float):
        self.comm = comm
        self.bucket_bytes = int(bucket_mb * 2**20)
        self._buffer = np.empty(0, dtype=np.uint8)

    def _bucket_buffer(self, nbytes: int) -> np.ndarray:
        """One bucket's buffer, kept between versions: fresh pages each time cost page faults (and MPI
        registrations) that made a sync several times slower than the broadcast itself."""
        if self._buffer.size < nbytes:
            self._buffer = np.empty(nbytes, dtype=np.uint8)
        return self._buffer[:nbytes]

    def send(self, named_tensors, version: int) -> None:
        """Gather (FSDP) and broadcast one bucket at a time: the extra memory is one bucket plus one tensor."""
        named_tensors = list(named_tensors)
        manifest = [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named_tensors]
        sizes = [t.numel() * t.element_size() for _, t in named_tensors]
        buckets = plan_buckets(sizes, self.bucket_bytes)
        header = {"stop": False, "version": version, "manifest": manifest, "buckets": buckets}
        transport.bcast_object(self.comm, header, root=0)
        if not buckets:
            return
        staging = torch.from_numpy(self._bucket_buffer(max(sum(sizes[start:end]) for start, end in buckets)))
        for start, end in buckets:
            filled = 0
            for (_, tensor), size in zip(full_tensors(named_tensors[start:end]), sizes[start:end], strict=True):
                staging[filled : filled + size].copy_(_flat_bytes(tensor))
                filled += size
                del tensor  # a gathered tensor is freed before the next one is gathered
            transport.bcast_array(self.comm, staging[:filled].numpy(), root=0, max_sleep_s=TRANSFER_MAX_SLEEP_S)

    def stop(self) -> None:
        transport.bcast_object(self.comm, {"stop": True}, root=0)

    def receive(self, engine) -> int | None:
        def load_bucket(specs) -> None:
            sizes = [int(np.prod(shape)) * getattr(torch, dtype).itemsize for _, shape, dtype in specs]
            flat = self._bucket_buffer(sum(sizes))
            transport.bcast_array(self.comm, flat, root=0, max_sleep_s=TRANSFER_MAX_SLEEP_S)
            received, offset = [], 0
            for (name, shape, dtype), size in zip(specs, sizes, strict=True):
                raw = torch.from_numpy(flat[offset : offset + size])
                received.append((name, raw.view(getattr(torch, dtype)).view(shape)))
                offset += size
            engine.load_weight_bucket(received)  # copied out before the next bucket reuses the buffer

        return receive_buckets(self.comm, engine, load_bucket)
