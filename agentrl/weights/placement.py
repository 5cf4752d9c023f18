"""Where a job's weight group sits and what follows from it: the weight transport (`resolve_weight_sync`, a pure
function: `agentrl layout` and every rank call it with the same placements), whether engines view a node's
shared window, and each rank's part in a sync.
"""

from __future__ import annotations

from collections import Counter

from agentrl.config import ConfigError
from agentrl.layout import Role


def resolve_weight_sync(
    choice: str,
    colocate: bool,
    leader: tuple[int, int | None],
    rollouts: list[tuple[int, int | None]],
    rollout_gpus: int = 1,
    lora: bool = False,
) -> str:
    """`weights.transport` after `auto`, from where the weight group sits; ConfigError for a choice that cannot work.

    `leader` is the trainer leader's (node, GPU index), `rollouts` each rollout rank's (gpu None on CPU),
    as `weight_group_placements` gives them; a rollout engine uses `rollout_gpus`
    consecutive GPUs from its own (SGLang tensor parallelism). `auto` picks `shm` without CUDA; `nccl`
    when no two members share a GPU (NCCL refuses two members of its group on one device); `cuda_ipc`
    when every rollout rank sits on the leader's own GPU (one writer, the readers on its GPU); else
    `shm`, through host memory. `colocate` (`layout.colocate`) only words the errors. With `lora` (`model.lora`
    set) only adapters travel, over the CPU transports: `auto` picks `shm` and the GPU transports are refused.
    """
    on_gpu = leader[1] is not None and all(gpu is not None for _, gpu in rollouts)
    shared = None  # the first two members on one GPU: (member, member, node, gpu)
    owner = {tuple(leader): "the trainer leader"}
    for index, (node, base) in enumerate(rollouts if on_gpu else []):
        for gpu in range(base, base + rollout_gpus):
            if shared is None and (node, gpu) in owner:
                shared = (owner[node, gpu], f"rollout role_rank {index}", node, gpu)
            owner.setdefault((node, gpu), f"rollout role_rank {index}")
    elsewhere = next((i for i, place in enumerate(rollouts) if tuple(place) != tuple(leader)), None)
    on_leaders_gpu = on_gpu and bool(rollouts) and elsewhere is None and rollout_gpus == 1
    pick = "shm" if not on_gpu else "nccl" if shared is None else "cuda_ipc" if on_leaders_gpu else "shm"
    if lora:
        if choice in ("auto", "shm", "mpi"):
            return "shm" if choice == "auto" else choice
        raise ConfigError(
            f"model.lora sends adapters over the CPU transports only, but weights.transport={choice}; set "
            "weights.transport=auto (picks shm), shm or mpi"
        )
    if choice == "auto":
        return pick
    if choice in ("nccl", "cuda_ipc") and not on_gpu:
        raise ConfigError(
            f"weights.transport={choice} needs CUDA on the trainer leader and every rollout rank; this job has "
            "none. Use weights.transport=auto, shm or mpi on CPU"
        )
    if choice == "nccl" and shared is not None:
        first, second, node, gpu = shared
        why = " (layout.colocate=true)" if colocate else ""
        other = "cuda_ipc or shm" if on_leaders_gpu else "shm or mpi"
        raise ConfigError(
            f"weights.transport=nccl needs its own GPU for each member of the weight group, but {first} and "
            f"{second} share node {node}'s cuda:{gpu}{why}; use weights.transport=auto (picks {pick} here), {other}"
        )
    if choice == "cuda_ipc" and not on_leaders_gpu:
        where = f"node {leader[0]}'s cuda:{leader[1]}"
        if elsewhere is None:
            why = f"each rollout engine spans rollout.engine.tp_size={rollout_gpus} GPUs"
        else:
            node, gpu = rollouts[elsewhere]
            why = f"rollout role_rank {elsewhere} is on node {node}'s cuda:{gpu}"
        other = "shm or nccl" if shared is None else "shm or mpi"
        raise ConfigError(
            f"weights.transport=cuda_ipc needs every rollout rank on the trainer leader's GPU ({where}), but {why}; "
            f"use weights.transport=auto (picks {pick} here), {other}"
        )
    return choice


def weight_group_placements(
    roles: list[Role], nodes: list[int], gpus: list[int | None]
) -> tuple[tuple[int, int | None], list[tuple[int, int | None]]]:
    """Where the weight group sits: the trainer leader's (node, gpu) and each rollout rank's, in rank order."""
    leader = roles.index(Role.TRAINER)
    rollouts = [(nodes[rank], gpus[rank]) for rank, role in enumerate(roles) if role is Role.ROLLOUT]
    return (nodes[leader], gpus[leader]), rollouts


def maps_shared_weights(choice: bool | str, rollout_nodes: list[int]) -> bool:
    """`weights.shm_mapped` resolved: `auto` maps where some node holds two or more rollout ranks."""
    if choice == "auto":
        return max(Counter(rollout_nodes).values(), default=0) >= 2
    return bool(choice)


def weight_roles(
    roles: list[Role],
    nodes: list[int],
    transport: str = "shm",
    shm_mapped: bool | str = "auto",
    in_place: bool | str = False,
) -> list[str]:
    """Each rank's part in a weight sync: `send` (trainer leader), `bcast+shm` (first rollout rank of a
    node without the trainer leader: receives the one broadcast into the node's window), `shm`
    (reads the window), `mpi`/`...` (another transport's receiver) or `-` (not in the weight group).
    A rollout rank whose engine views the window rather than copying from it shows ` view`; the
    trainer leader whose parameters live in the window (`weights.shm_in_place`) shows `send in place`."""
    leader = roles.index(Role.TRAINER)
    rollout_nodes = [node for role, node in zip(roles, nodes, strict=True) if role is Role.ROLLOUT]
    view = " view" if maps_shared_weights(shm_mapped, rollout_nodes) else ""
    led_nodes: set[int] = {nodes[leader]}
    parts = []
    for rank, (role, node) in enumerate(zip(roles, nodes, strict=True)):
        if rank == leader:
            parts.append("send in place" if transport == "shm" and view and in_place is not False else "send")
        elif role is not Role.ROLLOUT:
            parts.append("-")
        elif transport != "shm":
            parts.append(transport)
        elif node in led_nodes:
            parts.append("shm" + view)
        else:
            led_nodes.add(node)
            parts.append("bcast+shm" + view)
    return parts
