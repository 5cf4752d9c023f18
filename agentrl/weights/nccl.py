"""GPU weight sync: a torch.distributed broadcast group (NCCL on GPUs, gloo on CPU), as SGLang's workers join one.

`DistributedWeightBroadcast` implements `agentrl.weights.WeightSync` and keeps its versioned
header: a small object over MPI (version, manifest, bucket boundaries, stop flag) precedes
the data. One process group holds the trainer leader (rank 0) and every engine worker (a
torch engine brings 1, an SGLang engine its TP workers). It is built the way SGLang's
`init_custom_process_group` builds its group (TCPStore rendezvous, PrefixStore(group_name),
`_new_process_group_helper`), so SGLang's workers and our sender meet on the same store
keys. Each bucket travels as one flat uint8 tensor: the tensors' bytes back to back,
SGLang's "flattened_bucket".

The CUDA IPC path, for ranks that share the trainer leader's GPU, is `agentrl.weights.cuda_ipc`.
"""

from __future__ import annotations

import datetime

import numpy as np
import torch

from agentrl import transport
from agentrl.weights.base import (
    TensorSpec,
    WeightSync,
    full_tensors,
    plan_buckets,
    receive_buckets,
    spec_nbytes,
    tensor_spec,
)

GROUP_NAME = "agentrl_weights"
GROUP_TIMEOUT = datetime.timedelta(minutes=10)


def check_alignment(specs: list[TensorSpec]) -> None:
    """Every tensor must start at a multiple of its item size inside the flat bucket (SGLang checks this too)."""
    offset = 0
    for spec in specs:
        itemsize = getattr(torch, spec[2]).itemsize
        if offset % itemsize:
            raise ValueError(
                f"tensor {spec[0]} ({spec[2]}) would start at byte {offset} of its bucket, not a multiple of "
                f"{itemsize}; give every weight one dtype (model.dtype) or order wider dtypes first"
            )
        offset += spec_nbytes(spec)


def flatten_bucket(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' bytes back to back in one contiguous uint8 tensor, on the tensors' device."""
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def unflatten_bucket(flat: torch.Tensor, specs: list[TensorSpec]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into `flat`, the inverse of `flatten_bucket`."""
    expected = sum(spec_nbytes(spec) for spec in specs)
    if flat.numel() != expected:
        raise ValueError(f"bucket holds {flat.numel()} bytes but its manifest describes {expected}")
    views, offset = [], 0
    for spec in specs:
        name, shape, dtype = spec
        size = spec_nbytes(spec)
        views.append((name, flat[offset : offset + size].view(getattr(torch, dtype)).view(shape)))
        offset += size
    return views


def make_header(specs: list[TensorSpec], version: int, bucket_bytes: int) -> dict:
    buckets = plan_buckets([spec_nbytes(spec) for spec in specs], bucket_bytes)
    for start, end in buckets:
        check_alignment(specs[start:end])
    return {"stop": False, "version": version, "manifest": specs, "buckets": buckets}


STOP_HEADER = {"stop": True}


def init_weight_group(backend: str, address: str, port: int, world_size: int, rank: int, group_name: str):
    """A process group outside the default one, created exactly as SGLang's workers create theirs.

    The same store prefixes on both sides are what lets our sender and SGLang's TP
    workers rendezvous; this mirrors sglang.srt.utils.common.init_custom_process_group.
    """
    from torch.distributed import distributed_c10d as c10d

    store, rank, world_size = next(c10d.rendezvous(f"tcp://{address}:{port}", rank, world_size, timeout=GROUP_TIMEOUT))
    store.set_timeout(GROUP_TIMEOUT)
    store = c10d.PrefixStore(group_name, store)
    group, _ = c10d._new_process_group_helper(
        world_size, rank, [], c10d.Backend(backend), store, group_name=group_name, timeout=GROUP_TIMEOUT
    )
    c10d._world.pg_group_ranks[group] = {member: member for member in range(world_size)}
    return group


def group_offsets(members: list[int]) -> tuple[list[int], int]:
    """Each weight-comm rank's first rank in the process group (an exclusive scan), and the group size."""
    offsets = np.concatenate([[0], np.cumsum(members)[:-1]]).astype(int).tolist()
    return offsets, int(sum(members))


class DistributedWeightBroadcast(WeightSync):
    """Bucketed torch.distributed broadcast from the trainer leader to every engine worker.

    Every rank of `weight_comm` constructs one: the trainer leader (rank 0 there) with
    `engine=None` connects at once; a rollout rank connects then if given its engine,
    else at its first `receive` (the trainer waits for it over MPI meanwhile).
    """

    def __init__(self, weight_comm, bucket_mb: float, backend: str = "nccl", device="cpu", engine=None):
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be 'nccl' or 'gloo', not {backend!r}")
        self.comm = weight_comm
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.backend = backend
        self.device = torch.device(device)
        self.is_sender = weight_comm.Get_rank() == 0
        self.group = None
        if self.is_sender and engine is not None:
            raise ValueError("the trainer leader (weight_comm rank 0) sends weights and passes engine=None")
        if self.is_sender or engine is not None:
            self._connect(engine)

    def _connect(self, engine) -> None:
        """The group's rendezvous, collective over weight_comm (a rollout rank may defer it to its first receive)."""
        members = np.zeros(self.comm.Get_size(), dtype=np.int64)
        members[self.comm.Get_rank()] = 1 if self.is_sender else engine.weight_group_size
        offsets, world_size = group_offsets(transport.allreduce_sum(self.comm, members).tolist())
        address = transport.rendezvous_address(self.comm)
        if self.is_sender:
            self.group = init_weight_group(self.backend, *address, world_size, 0, GROUP_NAME)
        else:
            engine.join_weight_group(*address, offsets[self.comm.Get_rank()], world_size, GROUP_NAME, self.backend)
            self.group = GROUP_NAME  # the engine holds the group itself
        transport.barrier(self.comm)

    def send(self, named_tensors, version: int) -> None:
        named_tensors = list(named_tensors)
        specs = [tensor_spec(name, tensor) for name, tensor in named_tensors]
        header = make_header(specs, version, self.bucket_bytes)
        transport.bcast_object(self.comm, header, root=0)
        in_flight = None
        for start, end in header["buckets"]:
            flat = flatten_bucket([t.to(self.device) for _, t in full_tensors(named_tensors[start:end])])
            work = torch.distributed.broadcast(flat, group=self.group, group_src=0, async_op=True)
            if in_flight is not None:
                in_flight[0].wait()  # the previous bucket overlapped with flattening this one
            in_flight = (work, flat)  # holding `flat` keeps its memory from reuse until the broadcast is done
        if in_flight is not None:
            in_flight[0].wait()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        transport.barrier(self.comm)  # every engine has loaded this version

    def stop(self) -> None:
        transport.bcast_object(self.comm, STOP_HEADER, root=0)

    def receive(self, engine) -> int | None:
        if self.group is None:
            self._connect(engine)
        version = receive_buckets(self.comm, engine, lambda specs: engine.receive_weight_bucket(specs, GROUP_NAME))
        if version is not None:
            transport.barrier(self.comm)
        return version
