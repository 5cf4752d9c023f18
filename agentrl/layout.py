"""Rank -> role assignment, role communicators and node-local GPU binding.

Ranks are assigned in order: trainers first, then rollout, env and scorer ranks. World size 1
runs every role in one process; layout.hybrid, trainer and rollout in each rank. Trainer, rollout and scorer
ranks bind GPUs by their node-local index among GPU-using ranks; env ranks never take a GPU.
"""

from __future__ import annotations

import os
from enum import Enum

import numpy as np

from agentrl import transport
from agentrl.config import ConfigError, LayoutConfig


class Role(str, Enum):
    TRAINER = "trainer"
    ROLLOUT = "rollout"
    ENV = "env"
    SCORER = "scorer"


GPU_ROLES = (Role.TRAINER, Role.ROLLOUT, Role.SCORER)
# Group ranks into simulated nodes of this many consecutive ranks, in place of the real
# hosts (Split_type(COMM_TYPE_SHARED)): tests of the cross-node paths on one machine.
RANKS_PER_NODE_VARIABLE = "AGENTRL_RANKS_PER_NODE"


def simulated_ranks_per_node() -> int | None:
    """$AGENTRL_RANKS_PER_NODE as a positive int, or None when unset; ConfigError for anything else."""
    value = os.environ.get(RANKS_PER_NODE_VARIABLE, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(
            f"{RANKS_PER_NODE_VARIABLE}={value!r} must be a positive whole number of ranks per simulated node "
            f"(e.g. {RANKS_PER_NODE_VARIABLE}=2), or unset to group ranks by their real host"
        )
    return int(value)


def job_nodes(world) -> tuple[list[int], list[str] | None]:
    """(each rank's node id, each rank's host name) of `world`, collectively. A node's id is its first rank; the
    hosts are None where nodes are simulated ($AGENTRL_RANKS_PER_NODE)."""
    from mpi4py import MPI

    per_node = simulated_ranks_per_node()
    if per_node is not None:
        return [rank // per_node for rank in range(world.Get_size())], None
    hosts = world.allgather(MPI.Get_processor_name())
    return [hosts.index(host) for host in hosts], hosts


def node_ids(hosts: list[str]) -> list[int]:
    """Each rank's node, numbered 0, 1, ... in the order hosts first appear in rank order."""
    order = list(dict.fromkeys(hosts))
    return [order.index(host) for host in hosts]


def assign_roles(layout: LayoutConfig, world_size: int) -> list[Role]:
    """Role of each world rank. Raises ConfigError naming both sizes when they differ."""
    if world_size == 1:
        return [Role.TRAINER]  # single-process mode: this rank runs every role
    if layout.world_size != world_size:
        if layout.hybrid:
            raise ConfigError(
                f"layout.hybrid=true runs layout.trainer={layout.trainer} ranks, each generating and training, but "
                f"the job has {world_size}; launch with `mpirun -n {layout.trainer}` or set "
                f"layout.trainer={world_size}"
            )
        scorer = f" + scorer={layout.scorer}" if layout.scorer else ""
        raise ConfigError(
            f"layout needs {layout.world_size} ranks (trainer={layout.trainer} + rollout={layout.rollout} + "
            f"env={layout.env}{scorer}) but the job has {world_size}; launch with "
            f"`mpirun -n {layout.world_size}` or change layout.* so the counts add up to {world_size}"
        )
    if layout.hybrid:
        return [Role.TRAINER] * layout.trainer  # each also a rollout rank (`Layout.rollout_ranks`)
    roles = [Role.TRAINER] * layout.trainer + [Role.ROLLOUT] * layout.rollout + [Role.ENV] * layout.env
    return roles + [Role.SCORER] * layout.scorer


def bind_gpus(
    roles: list[Role], nodes: list[int], gpus_per_node: int, colocate: bool = False, rollout_gpus: int = 1
) -> list[int | None]:
    """GPU index per rank: node-local order among trainer, rollout and scorer ranks, modulo the node's GPUs.

    A rollout rank takes `rollout_gpus` consecutive GPUs (SGLang's tensor parallelism)
    and gets the first. Colocated, only trainers and scorers count: rollout rank i takes the GPU of
    trainer rank i, which must be on the same node.
    """
    if gpus_per_node <= 0:
        return [None] * len(roles)
    if colocate and rollout_gpus > 1:
        raise ConfigError(
            f"layout.colocate shares one trainer GPU per rollout rank, but rollout.engine.tp_size={rollout_gpus}; "
            "set rollout.engine.tp_size=1 or layout.colocate=false"
        )
    if rollout_gpus > gpus_per_node:
        raise ConfigError(
            f"rollout.engine.tp_size={rollout_gpus} GPUs per engine, but nodes have {gpus_per_node}; "
            "lower rollout.engine.tp_size"
        )
    owners = (Role.TRAINER, Role.SCORER) if colocate else GPU_ROLES
    seen_on_node: dict[int, int] = {}
    gpus: list[int | None] = []
    for role, node in zip(roles, nodes, strict=True):
        if role not in owners:
            gpus.append(None)
            continue
        width = rollout_gpus if role is Role.ROLLOUT else 1
        local = seen_on_node.get(node, 0) % gpus_per_node
        if local + width > gpus_per_node:
            local = 0  # an engine's GPUs never wrap around the node's last GPU
        seen_on_node[node] = local + width
        gpus.append(local)
    if colocate:
        _share_trainer_gpus(roles, nodes, gpus)
    return gpus


def _share_trainer_gpus(roles: list[Role], nodes: list[int], gpus: list[int | None]) -> None:
    trainers = [rank for rank, role in enumerate(roles) if role is Role.TRAINER]
    rollouts = [rank for rank, role in enumerate(roles) if role is Role.ROLLOUT]
    if len(rollouts) > len(trainers):
        raise ConfigError(
            f"layout.colocate puts rollout rank i on trainer rank i's GPU, but layout.rollout={len(rollouts)} > "
            f"layout.trainer={len(trainers)}; set layout.rollout <= layout.trainer or layout.colocate=false"
        )
    for trainer, rollout in zip(trainers, rollouts, strict=False):
        if nodes[trainer] != nodes[rollout]:
            raise ConfigError(
                f"layout.colocate: rollout rank {rollout} runs on node {nodes[rollout]} but its trainer rank "
                f"{trainer} on node {nodes[trainer]}; place each trainer and its rollout rank on one node "
                "(e.g. 2 x trainers-per-node ranks per node) or set layout.colocate=false"
            )
        gpus[rollout] = gpus[trainer]


def shared_trainer_gpu(roles: list[Role], nodes: list[int], gpus: list[int | None]) -> tuple[int, int, int, int] | None:
    """The first two trainer ranks bound to one GPU, as (rank, rank, node, gpu), or None.

    NCCL refuses two ranks of its group on one device, so such trainer ranks reduce over gloo
    (`agentrl.trainer.model.trainer_backend`), which cannot shard: FSDP is refused there
    (`agentrl.run.plan.plan`)."""
    first: dict[tuple[int, int], int] = {}
    for rank, (role, node, gpu) in enumerate(zip(roles, nodes, gpus, strict=True)):
        if role is not Role.TRAINER or gpu is None:
            continue
        if (node, gpu) in first:
            return first[node, gpu], rank, node, gpu
        first[node, gpu] = rank
    return None


def sharding_refusal(shared: tuple[int, int, int, int], role: str) -> str:
    """Why parallelism.fsdp=true cannot run where two ranks of `role` (trainer, SFT) share a GPU, and the fix."""
    first, second, node, gpu = shared
    return (
        f"parallelism.fsdp=true shards over NCCL, but {role} ranks {first} and {second} share node {node}'s "
        f"cuda:{gpu}, and NCCL refuses two ranks on one GPU; set parallelism.fsdp=false (replicas then reduce over "
        f"gloo) or run at most as many {role} ranks per node as it has GPUs"
    )


class Layout:
    """This process's view of the job: its role, the role communicators, its device."""

    def __init__(self, layout: LayoutConfig, comm=None, gpus_per_node: int | None = None, rollout_gpus: int = 1):
        from mpi4py import MPI

        self.world = comm if comm is not None else MPI.COMM_WORLD
        transport.barrier(self.world)  # blocking collectives spin: ranks still importing would lose a core
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.single_process = self.size == 1
        self.roles = assign_roles(layout, self.size)
        self.role = self.roles[self.rank]
        self.trainer_ranks = [r for r, role in enumerate(self.roles) if role is Role.TRAINER]
        self.hybrid = layout.hybrid and not self.single_process  # every rank a trainer and a rollout rank
        self.rollout_ranks = [
            r for r, role in enumerate(self.roles) if role is Role.ROLLOUT or (self.hybrid and role is Role.TRAINER)
        ]
        self.env_ranks = [r for r, role in enumerate(self.roles) if role is Role.ENV]
        self.scorer_ranks = [r for r, role in enumerate(self.roles) if role is Role.SCORER]
        self.role_comm = self.world.Split(color=list(Role).index(self.role), key=self.rank)
        self.role_rank = self.role_comm.Get_rank()
        # The weight group: trainer leader (root 0 inside it) plus every rollout rank.
        in_weight_group = self.rank == self.trainer_ranks[0] or self.role is Role.ROLLOUT  # hybrid: none needed
        self.weight_comm = self.world.Split(color=0 if in_weight_group else MPI.UNDEFINED, key=self.rank)
        self.nodes, self.hosts = job_nodes(self.world)
        if self.hosts is not None:
            node_comm = self.world.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        else:
            node_comm = self.world.Split(color=self.nodes[self.rank], key=self.rank)
        self.node = self.nodes[self.rank]
        self.node_rank, self.node_size = node_comm.Get_rank(), node_comm.Get_size()
        node_comm.Free()
        if gpus_per_node is None:
            # Counted by the ranks that may use a GPU (env ranks then never import torch); every rank takes the most
            # any of them sees, so all bind the same GPUs.
            from agentrl.transport import wait

            counted = np.array([-1 if self.role is Role.ENV else _visible_gpus()], dtype=np.int64)
            most = np.empty_like(counted)
            wait(self.world.Iallreduce(counted, most, op=MPI.MAX), what="the GPU count")  # polled: no spinning
            gpus_per_node = max(0, int(most[0]))
        self.gpus_per_node = gpus_per_node  # every node is taken to have as many
        colocate = layout.colocate and not self.single_process
        # The whole job's GPU per rank (None: CPU): where the weight group sits decides its transport.
        self.gpus = bind_gpus(self.roles, self.nodes, gpus_per_node, colocate, rollout_gpus)
        self.gpu = self.gpus[self.rank]
        self.shared_trainer_gpu = shared_trainer_gpu(self.roles, self.nodes, self.gpus)

    @property
    def is_trainer_leader(self) -> bool:
        return self.rank == self.trainer_ranks[0]

    def env_rank_for(self, rollout_rank: int) -> int | None:
        """The env rank serving a rollout rank, or None when envs run in-process."""
        if not self.env_ranks:
            return None
        return self.env_ranks[self.rollout_ranks.index(rollout_rank) % len(self.env_ranks)]

    def rollout_ranks_served_by(self, env_rank: int) -> list[int]:
        return [r for r in self.rollout_ranks if self.env_rank_for(r) == env_rank]

    def scorer_rank_for(self, rollout_rank: int) -> int | None:
        """The scorer rank scoring a rollout rank's episodes, or None when its scorer runs in-process."""
        if not self.scorer_ranks:
            return None
        return self.scorer_ranks[self.rollout_ranks.index(rollout_rank) % len(self.scorer_ranks)]

    def rollout_ranks_scored_by(self, scorer_rank: int) -> list[int]:
        return [r for r in self.rollout_ranks if self.scorer_rank_for(r) == scorer_rank]

    @property
    def device(self) -> str:
        return f"cuda:{self.gpu}" if self.gpu is not None else "cpu"


def _visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def pinned_cores(cores: list[int], roles_on_node: list[Role], role: Role) -> list[int] | None:
    """runtime.pin_cores: the cores a rank of `role` keeps, given the node's `cores` and its ranks' roles.

    Trainer ranks share a part of the cores proportional to their number (at least one core,
    and at least one left for the rest); every other rank shares the remaining cores. None
    where there is nothing to split: one core, or only trainers or no trainers on the node.
    """
    trainers = sum(r is Role.TRAINER for r in roles_on_node)
    if len(cores) < 2 or trainers in (0, len(roles_on_node)):
        return None
    share = min(len(cores) - 1, max(1, round(len(cores) * trainers / len(roles_on_node))))
    ordered = sorted(cores)
    return ordered[:share] if role is Role.TRAINER else ordered[share:]
