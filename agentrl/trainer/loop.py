"""The trainer role's loop: take a batch, train on it, publish weights, log, checkpoint.

`collect(step)` hides where batches come from: rollout ranks over MPI, or the rollout
worker in this same process (world size 1). Everything else is the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from agentrl import preempt, transport
from agentrl.failures import FailureTally, abort_if_failing
from agentrl.trainer import checkpoint, staleness
from agentrl.trajectory import FINISH_REASONS, METRIC_PREFIX, concat
from agentrl.transport import Tag

# Sums logged as they are (`episode/NAME`), not divided by the episode count.
COUNT_NAMES = ("count", "failed", "groups", "zero_signal_groups")
# Per-episode sums whose TensorBoard name is not `episode/NAME_mean`.
EPISODE_NAMES = {
    "count": "count",
    "success": "success_rate",
    "failed": "failed",
}


def episode_sums(batch: dict[str, np.ndarray], version: int) -> dict[str, float]:
    """This shard's per-episode sums by name (trainer ranks all-reduce them by name)."""
    lengths = np.diff(batch["offsets"])
    response = np.add.reduceat(batch["loss_mask"].astype(np.int64), batch["offsets"][:-1]) if len(lengths) else []
    finish_counts = np.bincount(batch["finish"], minlength=len(FINISH_REASONS))
    sums = {
        "count": float(len(lengths)),
        "reward": float(batch["reward"].sum()),
        "success": float(batch["success"].sum()),
        "turns": float(batch["turns"].sum()),
        "tokens": float(lengths.sum()),
        "response_tokens": float(np.sum(response)),
        "failed": float(finish_counts[FINISH_REASONS.index("error")]),
        "weight_lag": float((version - batch["weight_version"]).sum()),
        **group_counts(batch),
    }
    sums.update(
        {key.removeprefix(METRIC_PREFIX): float(v.sum()) for key, v in batch.items() if key.startswith(METRIC_PREFIX)}
    )
    sums.update({f"finish_{reason}": float(n) for reason, n in zip(FINISH_REASONS, finish_counts, strict=True)})
    return sums


def group_counts(batch: dict[str, np.ndarray]) -> dict[str, float]:
    """Groups (tasks) in the shard, and those without signal: fewer than two episodes that did not fail, or
    all of them with the same reward (group-relative advantages are then 0; dynamic sampling drops such
    groups on the rollout side)."""
    valid = batch["finish"] != FINISH_REASONS.index("error")
    groups, index = np.unique(batch["group"], return_inverse=True)
    rewards = batch["reward"].astype(np.float64)
    count = np.bincount(index, weights=valid, minlength=len(groups))
    low = np.full(len(groups), np.inf)
    high = np.full(len(groups), -np.inf)
    np.minimum.at(low, index[valid], rewards[valid])
    np.maximum.at(high, index[valid], rewards[valid])
    zero_signal = (count < 2) | (high == low)
    return {"groups": float(len(groups)), "zero_signal_groups": float(zero_signal.sum())}


def episode_metrics(totals: dict[str, float]) -> dict[str, float]:
    """`episode/` scalars: sums become means per episode, except the counts in COUNT_NAMES."""
    count = max(totals["count"], 1.0)
    metrics = {}
    for name, value in totals.items():
        if name in COUNT_NAMES:
            metrics[f"episode/{name}"] = value
        elif name.startswith("finish_"):
            metrics[f"episode/{name}"] = value / count
        else:
            metrics[f"episode/{EPISODE_NAMES.get(name, name + '_mean')}"] = value / count
    if "tool_calls" in totals:
        metrics["episode/tool_error_rate"] = totals.get("tool_errors", 0.0) / max(totals["tool_calls"], 1.0)
    return metrics


def receive_from_rollouts(
    layout, abort_on_failed_fraction: float | None, recorder=None
) -> Callable[[int], tuple[dict, dict, list[str]]]:
    """`collect` for trainer ranks: this rank's shard from every rollout rank. The leader also takes stop requests
    that rollout and env ranks forwarded, stops the run when the step's episodes failed alike
    (runtime.abort_on_failed_fraction), and gives `recorder` (agentrl/data/recorder.py) the rollout ranks'
    data positions and episode records."""
    from agentrl.metrics import merge_stats

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
        return concat([m["batch"] for m in messages]), stats, samples

    return collect


def train_loop(
    config, trainer, tokenizer, collect, weights, start_step: int, role_comm, logger, extra_state=(), evaluate=None
) -> int:
    """`collect(step) -> (batch, rollout stats, sample texts)`; `weights`: the WeightSync to publish on, or None;
    `extra_state`: more parts checkpoints save beside the trainer's own (the data position); `evaluate(step)`:
    the evaluation at a step `config.eval.due` (before that step's batch; at `config.steps`, after the last
    step, on weights published for it), given on the trainer leader only.

    Returns the number of steps done: `config.steps`, or fewer when a stop signal ended the run early
    (a checkpoint for them is written and the rollout ranks are told to stop).
    """
    done = start_step
    for step in range(start_step, config.steps + 1):
        if evaluate is not None and config.eval.due(step):
            evaluate(step)
        if step == config.steps:
            break
        started = time.perf_counter()
        batch, stats, samples = collect(step)
        batch, staleness_sums = staleness.admit(batch, step, config.rollout.max_staleness)
        received = time.perf_counter()

        if weights is not None:
            weights.begin_update()
        metrics = trainer.train_step(batch)
        trained = time.perf_counter()

        done = step + 1
        stopping = done < config.steps and preempt.agreed(role_comm)
        if stopping and logger is not None:
            print(f"\nagentrl: {preempt.reason()}: stopping after step {done} with a checkpoint", flush=True)
        if weights is not None and stopping:
            weights.stop()
        elif weights is not None and (done < config.steps or config.eval.due(done)):
            weights.send(trainer.named_weights(), done)
        synced = time.perf_counter()
        saving = (config.checkpoint.every and done % config.checkpoint.every == 0) or done == config.steps or stopping

        totals = transport.allreduce_named(role_comm, episode_sums(batch, step))
        staleness_totals = transport.allreduce_named(role_comm, staleness_sums)
        if logger is not None:
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
