"""The trainer role's loop: take a batch, train on it, publish weights, log, checkpoint.

`collect(step)` hides where batches come from: rollout ranks over MPI, or the rollout
worker in this same process (world size 1). Everything else is the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from agentrl import preempt, transport
from agentrl.trainer import checkpoint
from agentrl.trajectory import FINISH_REASONS, concat
from agentrl.transport import Tag

EPISODE_SUMS = (
    "reward",
    "success",
    "turns",
    "tokens",
    "response_tokens",
    "failed",
    "weight_lag",
    "tool_calls",
    "tool_errors",
)


def episode_sums(batch: dict[str, np.ndarray], version: int) -> np.ndarray:
    """Per-shard sums, in a fixed order, so trainer ranks can all-reduce them."""
    lengths = np.diff(batch["offsets"])
    response = np.add.reduceat(batch["loss_mask"].astype(np.int64), batch["offsets"][:-1]) if len(lengths) else []
    finish_counts = np.bincount(batch["finish"], minlength=len(FINISH_REASONS))
    values = [
        batch["reward"].sum(),
        batch["success"].sum(),
        batch["turns"].sum(),
        lengths.sum(),
        np.sum(response),
        finish_counts[FINISH_REASONS.index("error")],
        (version - batch["weight_version"]).sum(),
        batch["tool_calls"].sum(),
        batch["tool_errors"].sum(),
    ]
    return np.array([len(lengths), *values, *finish_counts], dtype=np.float64)


def episode_metrics(totals: np.ndarray) -> dict[str, float]:
    count = max(totals[0], 1.0)
    sums = dict(zip(EPISODE_SUMS, totals[1 : 1 + len(EPISODE_SUMS)], strict=True))
    metrics = {
        "episode/count": totals[0],
        "episode/reward_mean": sums["reward"] / count,
        "episode/success_rate": sums["success"] / count,
        "episode/turns_mean": sums["turns"] / count,
        "episode/tokens_mean": sums["tokens"] / count,
        "episode/response_tokens_mean": sums["response_tokens"] / count,
        "episode/failed": sums["failed"],
        "episode/weight_lag_mean": sums["weight_lag"] / count,
        "episode/tool_calls_mean": sums["tool_calls"] / count,
        "episode/tool_errors_mean": sums["tool_errors"] / count,
        "episode/tool_error_rate": sums["tool_errors"] / max(sums["tool_calls"], 1.0),
    }
    for reason, n in zip(FINISH_REASONS, totals[1 + len(EPISODE_SUMS) :], strict=True):
        metrics[f"episode/finish_{reason}"] = n / count
    return metrics


def receive_from_rollouts(layout) -> Callable[[int], tuple[dict, dict, list[str]]]:
    """`collect` for trainer ranks; the leader also takes stop requests that rollout and env ranks forwarded."""

    def collect(step: int):
        messages, transfer = [], 0.0
        for rank in layout.rollout_ranks:
            transport.wait_for_message(layout.world, rank, Tag.TRAJECTORIES)
            started = time.perf_counter()
            messages.append(transport.recv(layout.world, rank, Tag.TRAJECTORIES)[0])
            transfer += time.perf_counter() - started
        if layout.is_trainer_leader:
            preempt.take_forwarded(layout.world)
        stats = {key: max(m["stats"][key] for m in messages) for key in messages[0]["stats"]}
        stats["time/transfer"] = transfer
        samples = [text for m in messages for text in m["samples"]]
        return concat([m["batch"] for m in messages]), stats, samples

    return collect


def train_loop(config, trainer, tokenizer, collect, weights, start_step: int, role_comm, logger) -> int:
    """`collect(step) -> (batch, rollout stats, sample texts)`; `weights`: the WeightSync to publish on, or None.

    Returns the number of steps done: `config.steps`, or fewer when a stop signal ended the run early
    (a checkpoint for them is written and the rollout ranks are told to stop).
    """
    done = start_step
    for step in range(start_step, config.steps):
        started = time.perf_counter()
        batch, stats, samples = collect(step)
        received = time.perf_counter()

        metrics = trainer.train_step(batch)
        trained = time.perf_counter()

        done = step + 1
        stopping = done < config.steps and preempt.agreed(role_comm)
        if stopping and logger is not None:
            print(f"\nagentrl: {preempt.reason()}: stopping after step {done} with a checkpoint", flush=True)
        if weights is not None and stopping:
            weights.stop()
        elif weights is not None and done < config.steps:
            weights.send(trainer.named_weights(), done)
        synced = time.perf_counter()
        saving = (config.checkpoint.every and done % config.checkpoint.every == 0) or done == config.steps or stopping

        totals = transport.allreduce_sum(role_comm, episode_sums(batch, step))
        if logger is not None:
            metrics.update(episode_metrics(totals))
            metrics.update(stats)
            step_time = time.perf_counter() - started
            metrics["time/wait_rollout"] = received - started
            metrics["time/train"] = trained - received
            metrics["time/weight_sync"] = synced - trained
            metrics["time/step"] = step_time
            metrics["perf/tokens_per_s"] = totals[1 + EPISODE_SUMS.index("tokens")] / step_time
            metrics["perf/generated_tokens_per_s"] = totals[1 + EPISODE_SUMS.index("response_tokens")] / step_time
            logger.log(step, metrics)
            if samples:
                logger.samples(step, samples)
            if saving:
                logger.flush()  # on disk before the checkpoint exists: a resume from it loses no logged step

        if saving:
            checkpoint.save(  # every trainer rank: gathering a sharded (FSDP) model is a collective
                config.run_dir,
                done,
                trainer.model,
                tokenizer,
                trainer.optimizer,
                trainer.scheduler,
                config.checkpoint.keep,
                leader=logger is not None,
                checksums=config.checkpoint.checksums,
            )
            transport.barrier(role_comm)
        if stopping:
            break
    return done
