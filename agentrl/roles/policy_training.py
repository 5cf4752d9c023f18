"""The trainer side of a multi-policy job: each trained policy is a `PolicySide` (its trainer, its run folder's
logger and checkpoints, its weight sync), and `policy_train_loop` takes each step's batches by policy, trains every
side this process holds, publishes each policy's weights to the engines that serve it, logs and checkpoints.

A trainer rank holds one policy's side; a single process holds them all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.config import Config
from agentrl.config.policies import learner_of, opponents_of, policy_view
from agentrl.metrics import episode_metrics, episode_sums
from agentrl.policies.ratings import EloRatings
from agentrl.policies.worker import game_metrics
from agentrl.roles.trainer_parts import leader_parts, policy_trainer
from agentrl.run import preempt, startup_gc
from agentrl.trainer import checkpoint, staleness


@dataclass
class PolicySide:
    """One trained policy on this process: `view` (its config, agentrl.config.policies), trainer and tokenizer,
    `comm` (its trainer ranks), on its leader the `logger` and the `weights` sync (None elsewhere), and for the
    self-play learner its Elo `ratings`."""

    name: str
    view: Config
    trainer: object
    tokenizer: object
    comm: object
    leader: bool
    logger: object | None = None
    weights: object | None = None
    ratings: EloRatings | None = None

    @property
    def extra_state(self) -> list:
        return [*self.trainer.extra_state, *([self.ratings] if self.ratings is not None else [])]


def make_side(config: Config, name: str, device: str, comm, group, start_step: int, leader: bool) -> PolicySide:
    """Policy `name`'s side, resumed from its checkpoint of `start_step` when there is one."""
    from agentrl.models.loading import load_tokenizer

    view = policy_view(config, name)
    resumed_from = checkpoint.step_path(view.run_dir, start_step) if start_step else None
    trainer = policy_trainer(view, str(resumed_from or view.model.path), device, group, comm)
    ratings = EloRatings() if name == learner_of(config) else None
    side = PolicySide(name, view, trainer, load_tokenizer(view.model.path), comm, leader, ratings=ratings)
    if resumed_from is not None:
        checkpoint.load_state(
            resumed_from, trainer.optimizer, trainer.scheduler, trainer.model, extra_state=side.extra_state
        )
    pooled = any(o.kind == "pool" for o in opponents_of(config))
    if ratings is not None and pooled and start_step % config.game.pool.every == 0:
        ratings.add_snapshot(start_step)  # the rollout ranks snapshot the version they start on
    if leader:
        side.logger = leader_parts(view, start_step, None)[0]
    return side


Collect = Callable[[int], dict[str, tuple[dict, dict, list[str], list[tuple[str, float]]]]]


def policy_train_loop(config: Config, sides: list[PolicySide], collect: Collect, start_step: int, stop_comm) -> int:
    """`collect(step) -> {policy: (batch, stats, samples, games)}` for the sides here; `stop_comm`: every trainer rank
    of the job (a stop is agreed among them all). The steps done."""
    startup_gc.settle()
    done = start_step
    pool = config.game.pool if any(o.kind == "pool" for o in opponents_of(config)) else None
    for step in range(start_step, config.steps):
        started = time.perf_counter()
        batches = collect(step)
        received = time.perf_counter()
        metrics_of, totals_of = {}, {}
        for side in sides:
            batch, stats, samples, games = batches[side.name]
            batch, _ = staleness.admit(batch, step, 0)
            if side.weights is not None:
                side.weights.begin_update()
            # the episode sums ride the sum of the trainer's statistics
            metrics_of[side.name], totals_of[side.name] = side.trainer.train_and_sum(batch, episode_sums(batch, step))
        trained = time.perf_counter()
        done = step + 1
        stopping = done < config.steps and preempt.agreed(stop_comm)
        for side in sides:
            if side.weights is None:
                continue
            if stopping:
                side.weights.stop()
            elif done < config.steps:
                side.weights.send(side.trainer.named_weights(), done)
        synced = time.perf_counter()
        saving = (config.checkpoint.every and done % config.checkpoint.every == 0) or done == config.steps or stopping
        for side in sides:
            batch, stats, samples, games = batches[side.name]
            totals = totals_of[side.name]
            if side.ratings is not None:
                for opponent, outcome in games:
                    side.ratings.record(opponent, outcome)
                if pool is not None and done % pool.every == 0 and done < config.steps and not stopping:
                    side.ratings.add_snapshot(done)
            if side.logger is not None:
                metrics = metrics_of[side.name]
                metrics.update(episode_metrics(totals))
                metrics.update(game_metrics(stats))
                if side.ratings is not None:
                    metrics.update(side.ratings.metrics())
                metrics["time/wait_rollout"] = received - started
                metrics["time/train"] = trained - received
                metrics["time/weight_sync"] = synced - trained
                metrics["time/step"] = time.perf_counter() - started
                side.logger.log(step, metrics)
                if samples:
                    side.logger.samples(step, samples)
                if saving:
                    side.logger.flush()
            if saving:
                checkpoint.save_step(side.view, done, side.trainer, side.tokenizer, side.comm, side.leader,
                                     side.extra_state)  # fmt: skip
        if stopping:
            break
    return done
