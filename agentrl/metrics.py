"""Merging the rollout ranks' step statistics into one set of scalars for TensorBoard."""

from __future__ import annotations

import numpy as np

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
