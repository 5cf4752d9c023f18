"""The whole job's placement as a table, without MPI: which rank does what, on which node and device, and its
part in the weight sync. `agentrl layout` prints it for a config and a job size; a run prints its own at start."""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import Config, ConfigError, LayoutConfig
from agentrl.layout import (
    Layout,
    Role,
    assign_roles,
    bind_gpus,
    node_ids,
    sharding_refusal,
    shared_trainer_gpu,
)


@dataclass(frozen=True)
class JobShape:
    """A job's size and where its ranks sit: `ranks_per_node` consecutive ranks per node (None: all on one), or
    each rank's node where it is known (`nodes`, a running job's `Layout.nodes`), or each rank's host name
    (`hosts`, a running job's or `--hosts`; nodes are then numbered by host); `gpus_per_node` GPUs on each."""

    world_size: int
    ranks_per_node: int | None = None
    gpus_per_node: int = 0
    nodes: list[int] | None = None
    hosts: list[str] | None = None


@dataclass(frozen=True)
class RankPlan:
    rank: int
    role: Role
    role_rank: int
    node: int
    gpu: int | None
    weights: str = "-"
    host: str = ""
    hybrid: bool = False  # layout.hybrid: a trainer that is its own rollout rank


def plan(
    layout: LayoutConfig,
    job: JobShape,
    rollout_gpus: int = 1,
    weights_transport: str = "auto",
    shm_mapped: bool | str = "auto",
    in_place: bool | str = False,
    *,
    fsdp: bool = False,
    lora: bool = False,
) -> list[RankPlan]:
    """The whole job's placement, as `agentrl layout` prints it (no MPI needed).

    `weights_transport` is `weights.transport` as configured: resolved from the weight group's
    placements the way every rank resolves it (`agentrl.weights.resolve_weight_sync`), so `auto` shows
    the transport the run uses, and a choice that cannot work raises ConfigError. `fsdp`
    (`parallelism.fsdp`) is refused where trainer ranks share a GPU; `lora` (`model.lora` set) sends
    adapters over a CPU transport.
    """
    world_size, nodes, hosts = job.world_size, job.nodes, job.hosts
    roles = assign_roles(layout, world_size)
    if hosts is not None and len(hosts) != world_size:
        raise ConfigError(f"--hosts places {len(hosts)} ranks but the job has {world_size}; make the counts add up")
    if hosts is not None and nodes is None:
        nodes = node_ids(hosts)
    if nodes is None:
        per_node = job.ranks_per_node or world_size
        nodes = [rank // per_node for rank in range(world_size)]
    colocate = layout.colocate and world_size > 1
    gpus = bind_gpus(roles, nodes, job.gpus_per_node, colocate, rollout_gpus)
    shared = shared_trainer_gpu(roles, nodes, gpus)
    if fsdp and shared is not None:
        raise ConfigError(sharding_refusal(shared, "trainer"))
    if world_size > 1 and not layout.hybrid:
        # imported here: agentrl.weights loads torch, which env ranks (all but rank 0 print no plan) do without
        from agentrl.weights.placement import resolve_weight_sync, weight_group_placements, weight_roles

        leader, rollouts = weight_group_placements(roles, nodes, gpus)
        transport = resolve_weight_sync(weights_transport, colocate, leader, rollouts, rollout_gpus, lora=lora)
        if leader[1] is not None:  # GPU ranks neither view host memory nor train in it: they copy
            shm_mapped, in_place = False, False
        parts = weight_roles(roles, nodes, transport, shm_mapped, in_place)
    else:
        parts = ["in-process"] * world_size
    counters: dict[Role, int] = {}
    hybrid = layout.hybrid and world_size > 1
    rows = []
    for rank, (role, node, gpu, part) in enumerate(zip(roles, nodes, gpus, parts, strict=True)):
        host = hosts[rank] if hosts is not None else ""
        rows.append(RankPlan(rank, role, counters.get(role, 0), node, gpu, part, host, hybrid))
        counters[role] = counters.get(role, 0) + 1
    return rows


def config_plan(config: Config, job: JobShape) -> list[RankPlan]:
    """`plan` of a run of `config` as `job`: the transport and weight views it resolves, its sharding and adapters."""
    rows = plan(
        config.layout,
        job,
        config.rollout.engine.gpus,
        config.weights.transport,
        config.maps_weights,
        config.trains_in_window,
        fsdp=config.parallelism.fsdp,
        lora=config.model.lora is not None,
    )
    return policy_weights(config, rows) if config.policies and job.world_size > 1 else rows


def policy_weights(config: Config, rows: list[RankPlan]) -> list[RankPlan]:
    """Several policies: each policy's leader broadcasts over MPI to every rollout rank (agentrl/roles/policies.py)."""
    from dataclasses import replace

    from agentrl.config.policies import policy_trainer_ranks

    ranks = policy_trainer_ranks(config, [row.rank for row in rows if row.role is Role.TRAINER])
    leaders = {members[0]: name for name, members in ranks.items()}
    served = ", ".join(ranks)
    out = []
    for row in rows:
        if row.rank in leaders:
            weights = f"mpi send {leaders[row.rank]}"
        elif row.role is Role.ROLLOUT:
            weights = f"mpi recv {served}"
        else:
            weights = "-"
        out.append(replace(row, weights=weights))
    return out


def format_plan(rows: list[RankPlan], single_process: bool = False, evaluating: bool = False) -> str:
    """`evaluating` (`agentrl eval`): the trainer leader only gathers results and writes the report, and the
    other trainer ranks idle; they load no model and no rank syncs weights."""
    width = max((len(row.host) for row in rows), default=0)
    lines = ["rank  role     role_rank  node  " + (f"{'host':<{width}}  " if width else "") + "device  weights"]
    for row in rows:
        device = f"cuda:{row.gpu}" if row.gpu is not None else "cpu"
        role = "all" if single_process else "hybrid" if row.hybrid else row.role.value
        weights = "-" if evaluating else row.weights
        if evaluating and row.role is Role.TRAINER and not (single_process or row.hybrid):
            role, device = ("report" if row.role_rank == 0 else "idle"), "-"
        host = f"{row.host:<{width}}  " if width else ""
        lines.append(f"{row.rank:>4}  {role:<7}  {row.role_rank:>9}  {row.node:>4}  {host}{device:<6}  {weights}")
    return "\n".join(lines)


def parse_hosts(spec: str) -> list[str]:
    """Each rank's host from MPICH's `-hosts` syntax, `node0:2,node1:2` (a bare name: one rank), in rank order."""
    hosts = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition(":")
        if not name or (count and (not count.isdigit() or int(count) < 1)):
            raise ConfigError(f"--hosts {spec!r}: write HOST:RANKS,... (e.g. node0:2,node1:2)")
        hosts += [name] * int(count or 1)
    return hosts


def show_layout(config: Config, layout: Layout) -> None:
    """Rank 0: the run folder, then a table of this job's real nodes (numbered 0, 1, ... in rank order) and GPUs:
    what each rank binds and the weight transport every rank resolves from those placements."""
    print(f"agentrl: run_dir={config.run_dir} world={layout.size}", flush=True)
    nodes = [sorted(set(layout.nodes)).index(node) for node in layout.nodes]
    hosts = layout.hosts if layout.hosts and len(set(layout.hosts)) > 1 else None  # several nodes: show their names
    job = JobShape(layout.size, gpus_per_node=layout.gpus_per_node, nodes=nodes, hosts=hosts)
    print(format_plan(config_plan(config, job), layout.single_process), flush=True)
    if layout.shared_trainer_gpu is not None:
        first, second, node, gpu = layout.shared_trainer_gpu
        print(
            f"agentrl: trainer ranks {first} and {second} share node {node}'s cuda:{gpu}: the trainers reduce over "
            "gloo (NCCL needs a GPU per rank)",
            flush=True,
        )
