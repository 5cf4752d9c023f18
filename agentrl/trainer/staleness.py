"""The staleness bound on the trainer's side: what a step may train on, and how old it was.

The trainer trains step s on weights of version s. An episode's lag is s minus the oldest version
among its generated tokens; rollout.max_staleness = K admits lags 0..K. Episodes beyond K are
dropped before training and counted (`async/dropped_stale`): admission control on the rollout
side should make that impossible, so a count above 0 points at a bug, never at silent training.
"""

from __future__ import annotations

import numpy as np

from agentrl.trajectory import select_episodes


def admit(batch: dict[str, np.ndarray], step: int, max_staleness: int) -> tuple[dict[str, np.ndarray], dict]:
    """(the batch without stale episodes, sums to all-reduce over trainer ranks and pass to `metrics`)."""
    versions = batch["token_version"]
    generated = versions >= 0
    lengths = np.diff(batch["offsets"])
    oldest = np.full(len(lengths), step, dtype=np.int64)  # an episode that generated nothing is not stale
    newest = np.full(len(lengths), step, dtype=np.int64)
    if generated.any():
        episode_of_token = np.repeat(np.arange(len(lengths)), lengths)
        np.minimum.at(oldest, episode_of_token[generated], versions[generated])
        newest[:] = -1
        np.maximum.at(newest, episode_of_token[generated], versions[generated])
        newest = np.where(newest < 0, step, newest)
    stale = step - oldest > max_staleness
    sums = {"stale_episodes": float(stale.sum()), "partial_episodes": float((newest != oldest).sum())}
    if stale.any():
        batch = select_episodes(batch, ~stale)
        versions = batch["token_version"]
        generated = versions >= 0
    lags = step - versions[generated]
    counts = np.bincount(np.clip(lags, 0, max_staleness), minlength=max_staleness + 1)
    sums.update({"tokens": float(generated.sum()), "lag_sum": float(lags.sum()), "episodes": float(len(oldest))})
    sums.update({f"tokens_lag_{lag}": float(count) for lag, count in enumerate(counts)})
    return batch, sums


def metrics(totals: dict[str, float], max_staleness: int) -> dict[str, float]:
    """`async/` scalars from the all-reduced sums: lag mean and max over generated tokens, the share of tokens
    at each lag (the batch's staleness histogram), stale episodes dropped, episodes that took new weights in flight."""
    tokens = max(totals["tokens"], 1.0)
    lags = [totals[f"tokens_lag_{lag}"] for lag in range(max_staleness + 1)]
    out = {
        "async/lag_mean": totals["lag_sum"] / tokens,
        "async/lag_max": float(max((lag for lag, count in enumerate(lags) if count), default=0)),
        "async/dropped_stale": totals["stale_episodes"],
        "async/partial_episodes": totals["partial_episodes"] / max(totals["episodes"], 1.0),
    }
    out.update({f"async/tokens_lag_{lag}": count / tokens for lag, count in enumerate(lags)})
    return out
