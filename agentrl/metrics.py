"""Step scalars: the rollout ranks' statistics merged into one set, and the `episode/` metrics of a batch."""

from __future__ import annotations

import numpy as np

from agentrl.trajectory import FINISH_REASONS, METRIC_PREFIX

# How rollout stats of several rollout ranks become one: the slowest rank's times and rounds, the furthest
# rank's data epoch; means and rates over equal shares (every rank's first round is its share of the step's
# tasks) averaged; counts summed.
MAX_STATS_PREFIXES = ("time/", "rollout/extra_rounds", "data/")


MEAN_STATS_SUFFIXES = ("_mean", "_rate")


# With dynamic dispatch ranks run different numbers of first-round episodes: their rates weigh by that count.
MEAN_WEIGHT = "rollout/first_round_episodes"


def merge_stats(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One stats dict from every rollout rank's: times and rounds take the max (the slowest rank sets the
    step's pace), means and rates the mean, counts such as `rollout/dropped_groups` the sum."""
    names = sorted(set().union(*per_rank))
    merged = {}
    weighted = all(MEAN_WEIGHT in stats for stats in per_rank) and sum(stats[MEAN_WEIGHT] for stats in per_rank) > 0
    for name in names:
        values = [stats[name] for stats in per_rank if name in stats]
        if name.startswith(MAX_STATS_PREFIXES):
            merged[name] = max(values)
        elif name.endswith(MEAN_STATS_SUFFIXES) and weighted and name.startswith("rollout/"):
            weights = [stats[MEAN_WEIGHT] for stats in per_rank]
            merged[name] = float(np.average([stats[name] for stats in per_rank], weights=weights))
        elif name.endswith(MEAN_STATS_SUFFIXES):
            merged[name] = float(np.mean(values))
        else:
            merged[name] = float(sum(values))
    if len(per_rank) > 1 and all("time/rollout" in s and "rollout/generated_groups" in s for s in per_rank):
        times = [stats["time/rollout"] for stats in per_rank]
        groups = [stats["rollout/generated_groups"] for stats in per_rank]
        merged["time/rollout_spread"] = max(times) - min(times)
        merged["rollout/rank_groups_min"], merged["rollout/rank_groups_max"] = min(groups), max(groups)
    return merged


# Sums logged as they are (`episode/NAME`), not divided by the episode count.
COUNT_NAMES = ("count", "failed", "groups", "zero_signal_groups")
# Per-episode sums whose TensorBoard name is not `episode/NAME_mean`.
EPISODE_NAMES = {
    "count": "count",
    "success": "success_rate",
    "failed": "failed",
}


def episode_sums(batch: dict[str, np.ndarray], version: int) -> dict[str, float]:
    """This shard's per-episode sums by name (trainer ranks all-reduce them by name). An episode that became
    several samples (an agent program's session, agentrl/gateway/trace.py) counts once; its tokens all count."""
    lengths = np.diff(batch["offsets"])
    response = np.add.reduceat(batch["loss_mask"].astype(np.int64), batch["offsets"][:-1]) if len(lengths) else []
    first = first_samples(batch)
    finish_counts = np.bincount(batch["finish"][first], minlength=len(FINISH_REASONS))
    sums = {
        "count": float(first.sum()),
        "reward": float(batch["reward"][first].sum()),
        "success": float(batch["success"][first].sum()),
        "turns": float(batch["turns"][first].sum()),
        "tokens": float(lengths.sum()),
        "response_tokens": float(np.sum(response)),
        "failed": float(finish_counts[FINISH_REASONS.index("error")]),
        "weight_lag": float((version - batch["weight_version"][first]).sum()),
        **group_counts({key: batch[key][first] for key in ("finish", "group", "reward")}),
    }
    sums.update(
        {
            key.removeprefix(METRIC_PREFIX): float(v[first].sum())
            for key, v in batch.items()
            if key.startswith(METRIC_PREFIX)
        }
    )
    sums.update({f"finish_{reason}": float(n) for reason, n in zip(FINISH_REASONS, finish_counts, strict=True)})
    return sums


def first_samples(batch: dict[str, np.ndarray]) -> np.ndarray:
    """True on each episode's first sample (every row of a batch of env episodes)."""
    if "sample" not in batch:
        return np.ones(len(batch["offsets"]) - 1, dtype=bool)
    return batch["sample"] == 0


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
    """`episode/` scalars: sums become means per episode, except the counts in COUNT_NAMES.

    A batch without episodes (dynamic sampling dropped every group) logs its counts only: a mean over no
    episode is not 0, and `episode/success_rate` at 0 there read as a collapse on a policy that won every game."""
    count = totals["count"]
    if count == 0:
        return {f"episode/{name}": value for name, value in totals.items() if name in COUNT_NAMES}
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
    if "reasoning_tokens" in totals and totals.get("turns"):  # the env loop counts each turn's reasoning block
        metrics["episode/reasoning_tokens_per_turn"] = totals["reasoning_tokens"] / totals["turns"]
    return metrics
