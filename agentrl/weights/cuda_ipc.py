"""CUDA IPC weight sync: one writer (the trainer leader) and any number of readers on the writer's GPU.

The readers map the writer's memory once and copy from it at every version:

- The trainer leader shares CUDA IPC handles of the tensors it publishes: its parameters
  themselves where they are whole tensors on its GPU (their memory stays put across optimizer
  steps), else a staging buffer it keeps and writes each version into (FSDP's gathered
  tensors, or weights on another device). Handles travel only when that memory changes,
  as a new "generation"; readers open them once and keep the views.
- A sync is then one small header over MPI (version, generation, and the handles only when
  they changed), one fused copy per reader from the mapped memory into its engine's weights,
  and one allreduce in which every reader confirms it loaded the version. No MPI round trip
  per bucket, and no bytes flattened.

The writer synchronizes its stream before the header (the optimizer's writes are done); a
reader synchronizes its own before the confirming allreduce, so the trainer only changes its
weights again after every reader has copied them.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from agentrl import transport
from agentrl.weights.base import TRANSFER_MAX_SLEEP_S, WeightSync, full_tensors

STOP_HEADER = {"stop": True}


class CUDAIPCWeightSync(WeightSync):
    """Every rank of `weight_comm` constructs one; the readers must sit on the writer's GPU.

    `sleeps`: colocated engines give their GPU memory back while the trainer trains
    (`engine.sleep()` before waiting for a version, `engine.wake()` once it arrives).
    """

    def __init__(self, weight_comm, bucket_mb: float = 0.0, device="cuda", sleeps: bool = False):
        self.comm = weight_comm
        self.device = torch.device(device)
        self.sleeps = sleeps
        self.readers = weight_comm.Get_size() - 1
        self.generation = 0
        self._shared: tuple[list, list] | None = None  # writer: names and addresses the readers hold handles of
        self._published: list[tuple[str, torch.Tensor]] = []  # writer: kept alive while readers map it
        self._staging: torch.Tensor | None = None  # writer: for tensors that are not whole and on this GPU
        self._views: list[tuple[str, torch.Tensor]] = []  # reader: the writer's tensors, mapped
        self.seconds: dict[str, float] = {}  # the last sync's phases, for benchmarks/gpu_check.py

    # ---- writer ----------------------------------------------------------------------

    def send(self, named_tensors, version: int) -> None:
        clock = _Clock()
        published = self._publishable(list(named_tensors))
        # The same names at the same addresses are the tensors the readers mapped: whole parameters and the staging
        # buffer's views keep their shapes and strides while their memory stays put.
        shared = ([name for name, _ in published], [tensor.data_ptr() for _, tensor in published])
        handles = None
        if shared != self._shared:
            from torch.multiprocessing.reductions import reduce_tensor

            self.generation += 1
            self._shared, self._published = shared, published
            handles = [(name, reduce_tensor(tensor.detach())) for name, tensor in published]
        clock.mark("publish")
        torch.cuda.current_stream(self.device).synchronize()  # readers copy on their own streams
        clock.mark("writer_sync")
        header = {"stop": False, "version": version, "generation": self.generation, "handles": handles}
        transport.bcast_object(self.comm, header, root=0, max_sleep_s=TRANSFER_MAX_SLEEP_S)
        clock.mark("header")
        # The readers answer within one copy of the weights: polled closely, not with an idle rank's long sleeps.
        confirmed = transport.allreduce_sum(self.comm, np.zeros(1, dtype=np.int64), max_sleep_s=TRANSFER_MAX_SLEEP_S)
        self.seconds = clock.mark("readers_load")
        loaded = int(confirmed[0])
        if loaded != self.readers:
            raise RuntimeError(
                f"{self.readers - loaded} of {self.readers} rollout ranks did not load weight version {version} "
                "over CUDA IPC; their logs say why"
            )

    def _publishable(self, named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """The tensors readers map: the given ones where whole and on this GPU, else views of the staging buffer."""
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        if all(t.is_cuda and t.get_device() == index and not hasattr(t, "full_tensor") for _, t in named):
            return named
        nbytes = [t.numel() * t.element_size() for _, t in named]
        if self._staging is None or self._staging.numel() != sum(nbytes):
            self._staging = torch.empty(sum(nbytes), dtype=torch.uint8, device=self.device)
        views, offset = [], 0
        for (name, tensor), size in zip(full_tensors(named), nbytes, strict=True):
            view = self._staging[offset : offset + size].view(tensor.dtype).view(tensor.shape)
            view.copy_(tensor.detach())
            views.append((name, view))
            offset += size
        return views

    def stop(self) -> None:
        transport.bcast_object(self.comm, STOP_HEADER, root=0)

    # ---- reader ----------------------------------------------------------------------

    def receive(self, engine) -> int | None:
        if self.sleeps:
            engine.sleep()
        clock = _Clock()
        # Polled closely (at most TRANSFER_MAX_SLEEP_S late): a GPU rank's idle CPU costs little, a late reader
        # holds the trainer up for the whole of its lateness.
        header = transport.bcast_object(self.comm, None, root=0, max_sleep_s=TRANSFER_MAX_SLEEP_S)
        if header["stop"]:
            return None
        clock.mark("wait")
        if header["handles"] is not None:
            self._views = []  # the last generation's mappings go first
            self._views = [(name, rebuild(*args)) for name, (rebuild, args) in header["handles"]]
            self.generation = header["generation"]
        elif header["generation"] != self.generation:
            raise RuntimeError(
                f"weight generation {header['generation']} arrived without its CUDA IPC handles (this rank holds "
                f"generation {self.generation}): every rollout rank must receive every version"
            )
        if self.sleeps:
            engine.wake()
        engine.begin_weight_update()
        engine.load_weight_bucket(self._views)
        clock.mark("load")
        torch.cuda.current_stream(self.device).synchronize()  # copied before the trainer changes its weights
        clock.mark("copy")
        engine.end_weight_update(header["version"])
        transport.allreduce_sum(self.comm, np.ones(1, dtype=np.int64), max_sleep_s=TRANSFER_MAX_SLEEP_S)
        self.seconds = clock.mark("confirm")
        return header["version"]


class _Clock:
    """Seconds spent in each named phase, in order."""

    def __init__(self):
        self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def mark(self, phase: str) -> dict[str, float]:
        now = time.perf_counter()
        self.phases[phase] = now - self.last
        self.last = now
        return self.phases
