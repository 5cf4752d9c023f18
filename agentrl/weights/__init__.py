"""Weights from the trainer leader to the rollout engines, versioned: one module per transport, the choice here.

- `base`: the `WeightSync` interface, buckets, and the in-process and gather-only syncs;
- `mpi`: a bucketed MPI broadcast; `shm`: written once per node into MPI shared memory;
- `nccl`: a torch.distributed process group (NCCL on GPUs, gloo on CPU), the way SGLang's workers join one;
- `cuda_ipc`: one writer and any number of readers on its GPU;
- `placement`: which of them `weights.transport=auto` picks, from where the weight group sits; each rank's part;
- `announce`: the version announcement that lets rollout ranks running ahead take new weights;
- `lora`: with `model.lora`, adapter-only syncs confirmed by every engine (version and checksum).
"""

from __future__ import annotations

from agentrl.config import LoraConfig, WeightsConfig
from agentrl.weights.base import WeightSync
from agentrl.weights.placement import resolve_weight_sync, weight_group_placements


def make_weight_sync(
    weights: WeightsConfig,
    layout,
    engine=None,
    *,
    colocate: bool,
    rollout_gpus: int,
    lora: LoraConfig | None,
    mapped: bool | str,
    in_place: bool | str,
) -> WeightSync:
    """The weight sync for this rank of `layout.weight_comm` (trainer leader: engine=None; rollout: its engine).

    Every rank of the weight group resolves `weights.transport` from the whole job's placements
    (`layout.nodes`, `layout.gpus`), so all of them pick the same transport (`transport_for` builds it). The
    keywords are what other sections decide of it: `layout.colocate`, the GPUs of one engine
    (`rollout.engine.gpus`), `model.lora` (adapter-only syncs, each version confirmed by every engine), and
    `Config.maps_weights` / `Config.trains_in_window` (`weights.shm_mapped` / `shm_in_place` as resolved).
    """
    leader, rollouts = weight_group_placements(layout.roles, layout.nodes, layout.gpus)
    choice = resolve_weight_sync(weights.transport, colocate, leader, rollouts, rollout_gpus, lora=lora is not None)
    sync = transport_for(choice, layout, engine, weights.bucket_mb, colocate=colocate, mapped=mapped, in_place=in_place)
    if lora is None:
        return sync
    from agentrl.weights.lora import ConfirmedAdapterSync

    return ConfirmedAdapterSync(sync, layout.weight_comm)


def transport_for(
    choice: str, layout, engine, bucket_mb: float, *, colocate: bool, mapped: bool | str, in_place: bool | str
) -> WeightSync:
    """The transport `choice` (a resolved `weights.transport`) for this rank of `layout.weight_comm`."""
    if choice == "mpi":
        from agentrl.weights.mpi import MPIWeightBroadcast

        return MPIWeightBroadcast(layout.weight_comm, bucket_mb)
    if choice == "shm":
        from agentrl.weights.shm import SharedMemoryWeights

        return SharedMemoryWeights(layout.weight_comm, layout.node, bucket_mb, mapped, in_place)
    if choice in ("nccl", "gloo"):
        from agentrl.weights.nccl import DistributedWeightBroadcast

        return DistributedWeightBroadcast(layout.weight_comm, bucket_mb, choice, layout.device, engine)
    from agentrl.weights.cuda_ipc import CUDAIPCWeightSync

    # A colocated engine sleeps (frees its GPU memory) while the trainer trains; one merely sharing the GPU stays awake.
    return CUDAIPCWeightSync(layout.weight_comm, bucket_mb, layout.device, sleeps=colocate)
