"""The trainer role: build the policy trainer, then take a batch, train, publish weights, log and checkpoint
each step until the run's steps are done or a stop is agreed; after a stop, drain what was sent ahead.

`collect(step)` hides where batches come from: rollout ranks over MPI (`receive_from_rollouts`), or the
rollout worker in this same process (world size 1 and layout.hybrid, roles/hybrid.py). Everything else is the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from agentrl import node_wakeup, transport
from agentrl.config import Config
from agentrl.data.recorder import StepRecorder
from agentrl.evaluation.report import receive_results
from agentrl.layout import Layout
from agentrl.metrics import episode_metrics, episode_sums, merge_stats
from agentrl.roles.trainer_parts import leader_parts, make_trainer, weight_sync
from agentrl.rollout.failures import FailureTally, abort_if_failing
from agentrl.run import preempt, startup_gc
from agentrl.trainer import checkpoint, staleness
from agentrl.trainer.model import init_trainer_group
from agentrl.trajectory import concat
from agentrl.transport import Tag
from agentrl.weights.announce import AnnouncedWeights
from agentrl.weights.base import GatherOnly

STALENESS, STOP_VOTE = "staleness/", "stop_vote"  # names in the step's one sum over trainer ranks


@dataclass
class TrainingParts:
    """What `train_loop` trains with: the policy trainer and its tokenizer; on the trainer leader, the run logger
    and `evaluate(step)`, the evaluation at a step `config.eval.due` (None elsewhere, or without `eval:`)."""

    trainer: object
    tokenizer: object
    logger: object | None = None
    evaluate: Callable[[int], dict] | None = None


def run_trainer(config: Config, layout: Layout, start_step: int) -> tuple[int, dict[int, float] | None]:
    """Steps done, and on the leader the success rate logged at each step."""
    group = init_trainer_group(layout.role_comm, layout.device, shares_gpu=layout.shared_trainer_gpu is not None)
    trainer, tokenizer = make_trainer(config, layout, start_step, group)
    weights = GatherOnly()  # other trainer ranks join the leader's gathers of sharded (FSDP) weights
    if layout.is_trainer_leader:
        weights = weight_sync(config, layout)
        if config.rollout.max_staleness:
            weights = AnnouncedWeights(weights, layout.world, layout.rollout_ranks)
        weights.place(trainer.model)
    weights.send(trainer.named_weights(), start_step)
    node_wakeup.ring_ranks()
    logger, evaluate, recorder = None, None, None
    if layout.is_trainer_leader:
        results = receive_results(layout) if config.eval.enabled else None
        logger, evaluate = leader_parts(config, start_step, results)
        recorder = StepRecorder(config.run_dir, config.rollout.dump_episodes)
    collect = receive_from_rollouts(layout, config.runtime.abort_on_failed_fraction, recorder)
    extra = [recorder] if recorder is not None else []
    parts = TrainingParts(trainer, tokenizer, logger, evaluate)
    done = train_loop(config, parts, collect, weights, start_step, layout.role_comm, extra)
    if config.rollout.max_staleness and done < config.steps:  # stopped: batches generated ahead are still coming
        discarded = discard_batches_ahead(layout)
        if logger is not None and discarded:
            print(
                f"agentrl: discarded {discarded} batch(es) generated ahead of step {done}; a resumed run generates "
                "their tasks again",
                flush=True,
            )
    if logger is None:
        return done, None
    logger.close()
    return done, logger.success_by_step


def receive_from_rollouts(
    layout, abort_on_failed_fraction: float | None, recorder=None
) -> Callable[[int], tuple[dict, dict, list[str]]]:
    """`collect` for trainer ranks: this rank's shard from every rollout rank. The leader also takes stop requests
    that rollout and env ranks forwarded, stops the run when the step's episodes failed alike
    (runtime.abort_on_failed_fraction), and gives `recorder` (agentrl/data/recorder.py) the rollout ranks'
    data positions and episode records."""

    def collect(step: int):
        messages, transfer = [], 0.0
        for rank in layout.rollout_ranks:
            transport.wait_for_message(layout.world, rank, Tag.TRAJECTORIES)
            started = time.perf_counter()
            messages.append(transport.recv(layout.world, rank, Tag.TRAJECTORIES)[0])
            transfer += time.perf_counter() - started
        if layout.is_trainer_leader:
            preempt.take_forwarded(layout.world)
        stats = merge_stats([m["stats"] for m in messages])
        stats["time/transfer"] = transfer
        if layout.is_trainer_leader:
            abort_if_failing(step, FailureTally.merged([m["failures"] for m in messages]), abort_on_failed_fraction)
            if recorder is not None:
                episodes = [record for m in messages for record in m.get("episodes", [])]
                recorder.record(step, [m["data_position"] for m in messages if "data_position" in m], episodes)
        samples = [text for m in messages for text in m["samples"]]
        step_trained = sum(m["step_trained"] for m in messages)
        return concat([m["batch"] for m in messages]), stats, samples, step_trained

    return collect


def train_loop(config, parts: TrainingParts, collect, weights, start_step: int, role_comm, extra_state=()) -> int:
    """`collect(step) -> (batch, rollout stats, sample texts, the step's trained totals over the trainer ranks'
    shards or None)`; `weights`: the WeightSync to publish on, or None;
    `extra_state`: more parts checkpoints save beside the trainer's own (the data position). The evaluation at a
    step `config.eval.due` runs before that step's batch; at `config.steps`, after the last step, on weights
    published for it.

    Returns the number of steps done: `config.steps`, or fewer when a stop signal ended the run early
    (a checkpoint for them is written and the rollout ranks are told to stop).
    """
    trainer, tokenizer, logger, evaluate = parts.trainer, parts.tokenizer, parts.logger, parts.evaluate
    startup_gc.settle()
    done = start_step
    for step in range(start_step, config.steps + 1):
        if evaluate is not None and config.eval.due(step):
            evaluate(step)
        if step == config.steps:
            break
        started = time.perf_counter()
        batch, stats, samples, step_trained = collect(step)
        batch, staleness_sums = staleness.admit(batch, step, config.rollout.max_staleness)
        if config.rollout.max_staleness:  # stale episodes may have left some rank's shard
            step_trained = None
        received = time.perf_counter()

        if weights is not None:
            weights.begin_update()
        # the step's sums over trainer ranks and the stop vote (a signal on any rank stops all) ride the sum of the
        # trainer's statistics
        sums = {**episode_sums(batch, step), **{STALENESS + k: v for k, v in staleness_sums.items()}}
        metrics, totals = trainer.train_and_sum(batch, {**sums, STOP_VOTE: float(preempt.requested())}, step_trained)
        trained = time.perf_counter()

        done = step + 1
        stopping = done < config.steps and totals.pop(STOP_VOTE) > 0
        if stopping and logger is not None:
            print(f"\nagentrl: {preempt.reason()}: stopping after step {done} with a checkpoint", flush=True)
        if weights is not None and stopping:
            weights.stop()
            node_wakeup.ring_ranks()  # the rollout ranks waiting for it look now
        elif weights is not None and (done < config.steps or config.eval.due(done)):
            weights.send(trainer.named_weights(), done)
            node_wakeup.ring_ranks()
        synced = time.perf_counter()
        saving = (config.checkpoint.every and done % config.checkpoint.every == 0) or done == config.steps or stopping

        if logger is not None:
            staleness_totals = {k[len(STALENESS) :]: v for k, v in totals.items() if k.startswith(STALENESS)}
            totals = {k: v for k, v in totals.items() if not k.startswith(STALENESS)}
            metrics.update(episode_metrics(totals))
            metrics.update(staleness.metrics(staleness_totals, config.rollout.max_staleness))
            metrics.update(stats)
            step_time = time.perf_counter() - started
            metrics["time/wait_rollout"] = received - started
            metrics["time/train"] = trained - received
            metrics["time/weight_sync"] = synced - trained
            metrics["time/step"] = step_time
            metrics["perf/tokens_per_s"] = totals["tokens"] / step_time
            metrics["perf/generated_tokens_per_s"] = totals["response_tokens"] / step_time
            logger.log(step, metrics)
            if samples:
                logger.samples(step, samples)
            if saving:
                logger.flush()  # on disk before the checkpoint exists: a resume from it loses no logged step

        if saving:
            # every trainer rank: gathering a sharded (FSDP) model is a collective
            extra = [*trainer.extra_state, *extra_state]
            checkpoint.save_step(config, done, trainer, tokenizer, role_comm, logger is not None, extra)
        if stopping:
            break
    return done


def discard_batches_ahead(layout) -> int:
    """Trainer ranks, after a stop: take every batch the rollout ranks sent ahead, until each says it ended;
    the number of batches discarded."""
    discarded = 0
    for rank in layout.rollout_ranks:
        while not transport.recv(layout.world, rank, Tag.TRAJECTORIES)[0].get("end"):
            discarded += 1
    return discarded
