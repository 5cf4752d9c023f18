"""The roles of a multi-policy job (`policies:`): each trainer rank trains one policy with its policy's other trainer
ranks; each rollout rank serves every policy (one engine each) and sends each policy's trainers their shards; env
ranks are the single-policy ones. In one process, all of it takes turns.

Weights move per policy: each trained policy's leader has a weight communicator of its own with the rollout ranks
(MPI broadcast), so a version of one policy reaches only its engines and moves nothing of the others; a fixed
policy (`train: false`) never syncs.
"""

from __future__ import annotations

from agentrl import transport
from agentrl.config import Config
from agentrl.config.policies import policy_trainer_ranks, policy_view, shared_bases, trained_policies
from agentrl.layout import Layout, Role
from agentrl.policies.worker import MultiPolicyWorker
from agentrl.roles.policy_training import make_side, policy_train_loop
from agentrl.rollout.failures import FailureTally, abort_if_failing
from agentrl.rollout.trainer_messages import sample_texts, shard_for_trainers
from agentrl.run import preempt
from agentrl.run.start import RunStart
from agentrl.trajectory import concat, pack
from agentrl.transport import Tag


def run_policy_role(config: Config, layout: Layout, start: RunStart) -> tuple[int | None, dict[int, float] | None]:
    """This rank's part; the steps done and (first policy's leader) its success rate by step."""
    comms = PolicyComms(config, layout)
    if layout.rank == 0:
        print(f"agentrl: policies: {placement_text(config, layout, comms)}", flush=True)
    if layout.single_process:
        return run_single(config, layout, start.step)
    if layout.role is Role.TRAINER:
        return run_policy_trainer(config, layout, comms, start.step)
    run_policy_rollout(config, layout, comms, start.step)
    return None, None


def placement_text(config: Config, layout: Layout, comms: PolicyComms) -> str:
    """Which ranks train which policy, and where its weights go."""
    if layout.single_process:
        return ", ".join(config.policies) + " in this process"
    fixed = [name for name, policy in config.policies.items() if not policy.train]
    parts = [
        f"{name} trains on rank(s) {', '.join(map(str, ranks))} and syncs to rollout rank(s) "
        f"{', '.join(map(str, layout.rollout_ranks))}"
        for name, ranks in comms.ranks.items()
    ]
    parts += [f"{name} is fixed (never syncs)" for name in fixed]
    parts += [
        f"{', '.join(names)} share one base on each rollout rank (syncs carry their adapters only)"
        for names in shared_bases(config)
    ]
    return "; ".join(parts)


class PolicyComms:
    """Built on every rank together: each trained policy's trainer ranks (`ranks`), this trainer rank's policy
    (`mine`) and its communicator (`trainer_comm`), and each policy's weight communicator with the rollout ranks
    (`weight_comms`, on its leader and the rollout ranks)."""

    def __init__(self, config: Config, layout: Layout):
        self.ranks = policy_trainer_ranks(config, layout.trainer_ranks) if not layout.single_process else {}
        self.mine = next((name for name, ranks in self.ranks.items() if layout.rank in ranks), None)
        self.trainer_comm = None
        self.weight_comms = {}
        if layout.single_process:
            return
        # Create_group is collective over its members only: env ranks, which take no part, need not join
        world = layout.world
        if self.mine is not None:
            self.trainer_comm = world.Create_group(world.Get_group().Incl(self.ranks[self.mine]), tag=1)
        for number, (name, ranks) in enumerate(self.ranks.items()):
            members = [ranks[0], *layout.rollout_ranks]  # the policy's leader first: root 0 of its syncs
            if layout.rank in members:
                self.weight_comms[name] = world.Create_group(world.Get_group().Incl(members), tag=2 + number)


def policy_sync(config: Config, name: str, comm):
    """Policy `name`'s weight sync over `comm` (its leader is root 0): a bucketed MPI broadcast; with the policy's
    model.lora, adapters only, each version confirmed by every engine."""
    from agentrl.weights.mpi import MPIWeightBroadcast

    sync = MPIWeightBroadcast(comm, config.weights.bucket_mb)
    if policy_view(config, name).model.lora is None:
        return sync
    from agentrl.weights.lora import ConfirmedAdapterSync

    return ConfirmedAdapterSync(sync, comm)


def run_policy_trainer(config: Config, layout: Layout, comms: PolicyComms, start_step: int):
    from agentrl.trainer.model import init_trainer_group

    name, comm = comms.mine, comms.trainer_comm
    group = init_trainer_group(comm, layout.device)
    leader = comm.Get_rank() == 0
    side = make_side(config, name, layout.device, comm, group, start_step, leader)
    if leader:
        side.weights = policy_sync(config, name, comms.weight_comms[name])
        side.weights.send(side.trainer.named_weights(), start_step)
    collect = receive_policy_batches(layout, name, config.runtime.abort_on_failed_fraction, leader)
    done = policy_train_loop(config, [side], collect, start_step, layout.role_comm)
    if side.logger is None:
        return done, None
    side.logger.close()
    return done, side.logger.success_by_step if layout.is_trainer_leader else None


def receive_policy_batches(layout: Layout, name: str, abort_on_failed_fraction, leader: bool):
    """`collect` of a trainer rank of policy `name`: its shard from every rollout rank."""

    def collect(step: int):
        from agentrl.metrics import merge_stats

        messages = []
        for rank in layout.rollout_ranks:
            transport.wait_for_message(layout.world, rank, Tag.TRAJECTORIES)
            messages.append(transport.recv(layout.world, rank, Tag.TRAJECTORIES)[0])
        if layout.is_trainer_leader:
            preempt.take_forwarded(layout.world)
        if leader:
            abort_if_failing(step, FailureTally.merged([m["failures"] for m in messages]), abort_on_failed_fraction)
        stats = merge_stats([m["stats"] for m in messages])
        samples = [text for m in messages for text in m["samples"]]
        games = [game for m in messages for game in m["games"]]
        return {name: (concat([m["batch"] for m in messages]), stats, samples, games)}

    return collect


def run_policy_rollout(config: Config, layout: Layout, comms: PolicyComms, start_step: int) -> None:
    from agentrl.env.client import LocalEnvClient, MPIEnvClient
    from agentrl.roles.env import env_host

    env_rank = layout.env_rank_for(layout.rank)
    if config.agent.enabled:
        env_client = None  # agent programs play the env's part, through this rank's gateway
    elif env_rank is None:
        env_client = LocalEnvClient(env_host(config))
    else:
        env_client = MPIEnvClient(layout.world, env_rank, config.runtime.env_step_timeout_s)
    index = layout.rollout_ranks.index(layout.rank)
    worker = MultiPolicyWorker(config, env_client, index, len(layout.rollout_ranks), layout.device)
    worker.restore_pool(start_step)
    syncs = {name: policy_sync(config, name, comms.weight_comms[name]) for name in comms.ranks}

    def take_weights() -> bool:
        for name, sync in syncs.items():
            version = sync.receive(worker.engines[name])
            if version is None:
                return False
            worker.weights_taken(name, version)
        return True

    take_weights()
    for step in range(start_step, config.steps):
        by_policy, stats, games = worker.collect(step)
        if evaluation_due(config, step):
            stats.update(worker.evaluate(step))
        preempt.forward(layout.world, layout.trainer_ranks[0])
        failures = FailureTally.of([e for episodes in by_policy.values() for e in episodes])
        for name, ranks in comms.ranks.items():
            for number, shard in enumerate(shard_for_trainers(by_policy[name], len(ranks), index)):
                first = number == 0
                message = {
                    "batch": pack(shard),
                    "stats": stats if first else {},
                    "samples": sample_texts(config, step, shard) if first and index == 0 else [],
                    "games": games if first else [],
                    "failures": failures,
                }
                transport.send(layout.world, message, ranks[number], Tag.TRAJECTORIES)
        if step + 1 < config.steps and not take_weights():
            break
    worker.close()


def evaluation_due(config: Config, step: int) -> bool:
    """Held-out matches at this step: every game.evaluate.every steps and at the last step."""
    spec = config.game.evaluate if config.game is not None else None
    return spec is not None and (step % spec.every == 0 or step == config.steps - 1)


def run_single(config: Config, layout: Layout, start_step: int) -> tuple[int, dict[int, float]]:
    """World size 1: every policy's side and the rollout worker in this process."""
    from agentrl.env.client import LocalEnvClient
    from agentrl.roles.env import env_host

    sides = [
        make_side(config, name, layout.device, layout.role_comm, None, start_step, True)
        for name in trained_policies(config)
    ]
    env_client = None if config.agent.enabled else LocalEnvClient(env_host(config, check=False))
    worker = MultiPolicyWorker(config, env_client, 0, 1, layout.device)
    worker.restore_pool(start_step)
    for side in sides:
        side.weights = InProcessPolicyCopy(worker, side.name)
        side.weights.send(side.trainer.named_weights(), start_step)

    def collect(step: int):
        by_policy, stats, games = worker.collect(step)
        if evaluation_due(config, step):
            stats.update(worker.evaluate(step))
        episodes = [e for batch in by_policy.values() for e in batch]
        abort_if_failing(step, FailureTally.of(episodes), config.runtime.abort_on_failed_fraction)
        return {
            name: (pack(batch), stats, sample_texts(config, step, batch), games) for name, batch in by_policy.items()
        }

    done = policy_train_loop(config, sides, collect, start_step, layout.role_comm)
    worker.close()
    for side in sides:
        side.logger.close()
    return done, sides[0].logger.success_by_step


class InProcessPolicyCopy:
    """One process: a policy's engine copies the trainer's tensors; the worker then takes a pool snapshot if due."""

    def __init__(self, worker: MultiPolicyWorker, name: str):
        self.worker, self.name = worker, name

    def send(self, named_tensors, version: int) -> None:
        self.worker.engines[self.name].load_weights(named_tensors, version)
        self.worker.weights_taken(self.name, version)

    def stop(self) -> None:
        """Nothing to tell: the worker runs in this process."""

    def begin_update(self) -> None:
        """The engine holds copies: nothing to do before the optimizer changes the trainer's weights."""
