"""What a rollout rank is built from, each part given the config sections it reads, in the order they are made:
its env client, its scorer rank's client (layout.scorer), the weight sync, its tasks, the rollout worker, the step's
task queue (rollout.dispatch=dynamic) and the evaluator."""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.algorithms import algorithm_of
from agentrl.config import Config
from agentrl.data.loading import load_rows
from agentrl.data.tasks import DatasetTasks, SeededTasks, TaskSource
from agentrl.env.client import LocalEnvClient, MPIEnvClient
from agentrl.evaluation.runner import Evaluator
from agentrl.layout import Layout
from agentrl.roles.env import env_host
from agentrl.roles.trainer_parts import weight_sync
from agentrl.rollout.dispatch import DispatchClient, DispatchServer
from agentrl.rollout.worker import RolloutWorker, WorkerSections
from agentrl.run.start import RunStart
from agentrl.scoring.remote import RemoteScorer


@dataclass
class RolloutParts:
    """A rollout rank's parts: `env_client` (None where this rank runs agent programs itself), `scorer` (the client
    of its scorer rank; None without layout.scorer), `sync` (None in a single process, which copies weights
    in-process), `tasks`, `worker` and `evaluator` (None without `eval:`)."""

    env_client: object | None
    scorer: RemoteScorer | None
    sync: object | None
    tasks: TaskSource
    worker: RolloutWorker
    evaluator: Evaluator | None


def rollout_parts(config: Config, layout: Layout, start: RunStart) -> RolloutParts:
    """This rollout rank's parts (world size 1 and layout.hybrid: the process's, with envs of its own and no weight
    sync)."""
    single = layout.single_process
    index, count = (0, 1) if single else (layout.rollout_ranks.index(layout.rank), len(layout.rollout_ranks))
    env_rank = None if single else layout.env_rank_for(layout.rank)
    if env_rank is not None:
        env_client = remote_env_client(config, layout, env_rank)
    elif config.agent.enabled:
        env_client = None  # agent programs play the env's part, started by this rank, through its gateway
    else:
        env_client = LocalEnvClient(env_host(config, check=not single))
    scorer = scorer_client(config, layout)
    # a process-group sync connects at its first receive; in one process and hybrid ranks the engine copies in-process
    sync = None if single or layout.hybrid else weight_sync(config, layout)
    tasks = task_source(config, index if start.shards > 1 else 0, start.shards, start.data_start)
    worker = rollout_worker(config, env_client, index, count, layout.device, tasks, scorer)
    if config.rollout.dispatch == "dynamic" and count > 1:
        worker.dispatch = task_queue(config, layout, worker)
    evaluator = None
    if config.eval.enabled:
        evaluator = Evaluator(worker, index, count, eval_config=config.eval, data_val=config.data.val)
    return RolloutParts(env_client, scorer, sync, tasks, worker, evaluator)


def scorer_client(config: Config, layout: Layout) -> RemoteScorer | None:
    """This rollout rank's way to its scorer rank, or None where the `reward` section scores in-process."""
    scorer_rank = None if layout.single_process else layout.scorer_rank_for(layout.rank)
    return None if scorer_rank is None else RemoteScorer(layout.world, scorer_rank, config.reward)


def remote_env_client(config: Config, layout: Layout, env_rank: int) -> MPIEnvClient:
    """The client of this rollout rank's env rank, which hosts its envs or (agent:) runs its agent programs."""
    timeout_s = config.runtime.env_step_timeout_s
    if config.agent.enabled:
        from agentrl.gateway.agent_host import check_gateway_reachable

        if layout.hosts is not None:  # real nodes (simulated ones share this machine's loopback)
            check_gateway_reachable(config.agent, layout.hosts[layout.rank], layout.hosts[env_rank])
        # A call is a whole episode of the program, and the env rank runs its rollout ranks' batches one at a time.
        sharing = len(layout.rollout_ranks_served_by(env_rank))
        timeout_s = max(timeout_s or 0.0, config.agent.timeout_s * sharing)
    return MPIEnvClient(layout.world, env_rank, timeout_s)


def rollout_worker(config: Config, env_client, index: int, count: int, device: str = "cpu", tasks=None, scorer=None):
    """Rollout rank `index` of `count`: its engine on `device`, talking to `env_client`, drawing from `tasks`
    (None: the env's seeds), scoring with `scorer` (None: the `reward` section's model in-process, if any)."""
    sections = WorkerSections.of(config)
    return RolloutWorker(env_client, index, count, device, tasks, sections, algorithm_of(config), scorer)


def task_source(config: Config, shard: int, shards: int, data_start: list[int] | None) -> TaskSource:
    """This rollout rank's tasks: its share of data.train's rows from its saved position, or the env's seeds."""
    if not config.data.train:
        return SeededTasks(config.seed)
    rows = load_rows(config.data.train)
    return DatasetTasks(rows, config.data.train, config.seed, shard, shards, data_start[shard], config.data.shuffle)


def task_queue(config: Config, layout: Layout, worker: RolloutWorker) -> DispatchServer | DispatchClient:
    """rollout.dispatch=dynamic over several ranks: the first rollout rank serves the step's queue, the others
    claim from it."""
    if layout.rank == layout.rollout_ranks[0]:
        peers = layout.rollout_ranks[1:]
        extra = worker.algorithm.max_extra_rounds
        return DispatchServer(layout.world, peers, config.rollout.tasks_per_step, extra, worker.task_source)
    return DispatchClient(layout.world, layout.rollout_ranks[0])
