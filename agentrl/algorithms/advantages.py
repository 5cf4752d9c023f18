"""Episode-level advantage estimators beside GRPO's: RLOO and REINFORCE++ (with and without a group baseline).

Conventions shared by every estimator here (the trainer relies on them):

- numpy in, float32 numpy out, one advantage per episode (the trainer broadcasts it over the episode's
  trained tokens);
- `rewards` (N,) episode rewards, `groups` (N,) int task ids (the episodes sampled for one task share an id
  and sit on one trainer rank), `valid` (N,) bool: False marks a failed episode, which gets advantage 0 and
  is left out of every statistic;
- statistics that span the global batch (all trainer ranks) go through `reduce`, a callable that sums a
  float64 array elementwise over the trainer ranks (`local_sum`, the identity, on one rank). Every rank
  makes the same calls to `reduce` in the same order, whatever its data, so it may be a collective.

GRPO and Dr. GRPO live in `group_advantages` below: Dr. GRPO's advantage (Liu et al. 2025,
"Understanding R1-Zero-Like Training") is `group_advantages(rewards, groups, valid, std_norm=False)`, the
group-mean baseline without the division by the group's std; its other half is the loss aggregation
"seq-mean-token-sum-norm" in `agentrl.algorithms.losses.aggregate_loss`. No separate function is needed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Reduce = Callable[[np.ndarray], np.ndarray]


def local_sum(values: np.ndarray) -> np.ndarray:
    """The `reduce` of a single trainer rank: the sum over one rank is the array itself."""
    return values


def _as_valid(rewards: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    if valid is None:
        return np.ones(rewards.shape, dtype=bool)
    valid = np.asarray(valid, dtype=bool)
    if valid.shape != rewards.shape:
        raise ValueError(f"valid has shape {valid.shape}, rewards {rewards.shape}: pass one flag per episode")
    return valid


def _group_sums(values: np.ndarray, groups: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode (count, sum) of the valid members of its group."""
    _, inverse = np.unique(np.asarray(groups), return_inverse=True)
    inverse = inverse.reshape(-1)
    count = np.bincount(inverse, weights=valid.astype(np.float64))
    total = np.bincount(inverse, weights=np.where(valid, values, 0.0))
    return count[inverse], total[inverse]


def rloo_advantages(rewards: np.ndarray, groups: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    """REINFORCE with a leave-one-out baseline: r_i - mean of the OTHER valid episodes of i's group.

    Kool, van Hoof, Welling 2019 ("Buy 4 REINFORCE samples, get a baseline for free!"); Ahmadian et al.
    2024 ("Back to Basics: Revisiting REINFORCE Style Optimization", RLOO). With k valid members,
    r_i - (S - r_i)/(k - 1) = k/(k - 1) * (r_i - mean), the form verl's `compute_rloo_outcome_advantage`
    (`verl/trainer/ppo/core_algos.py`) computes. No std normalisation.

    A group with one valid member has no other episode to form a baseline: its advantage is 0 (as GRPO's
    `group_advantages`). verl instead passes the raw reward through for such a group.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    valid = _as_valid(rewards, valid)
    count, total = _group_sums(rewards, groups, valid)
    others = count - 1.0
    baseline = (total - rewards) / np.maximum(others, 1.0)
    advantages = np.where(valid & (others >= 1.0), rewards - baseline, 0.0)
    return advantages.astype(np.float32)


def _token_whiten(
    values: np.ndarray, weights: np.ndarray, reduce: Reduce, eps: float
) -> tuple[np.ndarray, float, float]:
    """(values - mean) / sqrt(var + eps), mean and var over all tokens of the global batch.

    Episode i stands for `weights[i]` tokens that all carry `values[i]`. Two reductions (count and sum,
    then the squared deviations), so the variance is the two-pass one. The variance is unbiased (Bessel,
    divided by tokens - 1) as verl's `masked_whiten`/`masked_var` (`verl/utils/torch_functional.py`);
    with one token or none in the whole batch it is taken as 0 (verl raises there).
    """
    count, total = reduce(np.array([weights.sum(), (weights * values).sum()], dtype=np.float64))
    mean = total / count if count > 0 else 0.0
    (squares,) = reduce(np.array([(weights * (values - mean) ** 2).sum()], dtype=np.float64))
    var = squares / (count - 1.0) if count > 1 else 0.0
    return (values - mean) / np.sqrt(var + eps), float(mean), float(var)


def _token_weights(response_tokens: np.ndarray, valid: np.ndarray) -> np.ndarray:
    tokens = np.asarray(response_tokens, dtype=np.float64)
    if tokens.shape != valid.shape:
        raise ValueError(f"response_tokens has shape {tokens.shape}, rewards {valid.shape}: one count per episode")
    if (tokens < 0).any():
        raise ValueError("response_tokens must be >= 0: pass the number of trained (loss-mask) tokens per episode")
    return np.where(valid, tokens, 0.0)


def reinforce_pp_advantages(
    rewards: np.ndarray,
    response_tokens: np.ndarray,
    valid: np.ndarray | None,
    reduce: Reduce = local_sum,
    eps: float = 1e-8,
) -> np.ndarray:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262) for an outcome reward: the return, whitened over the global batch.

    With one reward at the end of the episode and gamma = 1 every trained token's return is the episode's
    reward r_i. REINFORCE++ whitens the token returns over all trained tokens of the global batch (all
    trainer ranks), so the mean and the variance weight episode i by its token count n_i:

        mean = sum_i n_i r_i / N,  var = sum_i n_i (r_i - mean)^2 / (N - 1),  N = sum_i n_i,
        A_i  = (r_i - mean) / sqrt(var + eps)

    as verl's `compute_reinforce_plus_plus_outcome_advantage` (`verl/trainer/ppo/core_algos.py`) with its
    `masked_whiten`: unbiased variance, eps inside the square root. `response_tokens` (N,) counts each
    episode's trained (loss-mask) tokens. Invalid episodes and episodes without trained tokens weigh
    nothing in the statistics and get 0 (the latter have no token to carry an advantage). Calls `reduce`
    twice.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    valid = _as_valid(rewards, valid)
    weights = _token_weights(response_tokens, valid)
    whitened, _, _ = _token_whiten(rewards, weights, reduce, eps)
    return np.where(weights > 0, whitened, 0.0).astype(np.float32)


def reinforce_pp_baseline_advantages(
    rewards: np.ndarray,
    groups: np.ndarray,
    response_tokens: np.ndarray,
    valid: np.ndarray | None,
    reduce: Reduce = local_sum,
    eps: float = 1e-8,
) -> np.ndarray:
    """REINFORCE++-baseline (Hu 2025): subtract the group's mean reward, then whiten over the global batch.

    c_i = r_i - mean of the valid rewards of i's group (episodes weigh 1 each, as in verl's
    `compute_reinforce_plus_plus_baseline_outcome_advantage`), then c_i is whitened over all trained
    tokens of the global batch exactly as in `reinforce_pp_advantages` (token-count weighted mean,
    unbiased variance, eps inside the square root). A group with one valid member centres to c_i = 0 (its
    own mean; verl uses a baseline of 0 there and keeps the raw reward). The group mean counts every valid
    episode, with or without trained tokens; an episode without trained tokens gets 0. Calls `reduce` twice.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    valid = _as_valid(rewards, valid)
    weights = _token_weights(response_tokens, valid)
    count, total = _group_sums(rewards, groups, valid)
    centred = np.where(valid, rewards - total / np.maximum(count, 1.0), 0.0)
    whitened, _, _ = _token_whiten(centred, weights, reduce, eps)
    return np.where(weights > 0, whitened, 0.0).astype(np.float32)


def group_advantages(
    rewards: np.ndarray, groups: np.ndarray, valid: np.ndarray | None = None, std_norm: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """reward - mean(reward of its group) [/ std of the group]; invalid episodes get 0 and are left out of the stats.

    Groups with fewer than 2 valid members get 0. The std is the population one (numpy's default), over the valid
    members; all groups at once (bincounts), not a loop over groups."""
    rewards = np.asarray(rewards, dtype=np.float64)
    valid = np.ones_like(rewards, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    _, group = np.unique(np.asarray(groups), return_inverse=True)
    group = group.reshape(-1)
    count = np.bincount(group, weights=valid.astype(np.float64))
    members = np.maximum(count, 1.0)
    centred = np.where(
        valid, rewards - (np.bincount(group, weights=np.where(valid, rewards, 0.0)) / members)[group], 0.0
    )
    if std_norm:
        centred = centred / (np.sqrt(np.bincount(group, weights=centred * centred) / members)[group] + eps)
    return np.where(valid & (count[group] >= 2), centred, 0.0).astype(np.float32)
