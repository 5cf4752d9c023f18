"""PPO with a critic: GAE over the generated tokens of a multi-turn episode, the clipped value loss, whitening
and explained variance.

Time steps are the positions with mask == 1 (the model's generated tokens). Environment/observation tokens
between turns are not time steps: no value target, no discount across them; the first generated token after
an observation follows the last generated token before it directly.
"""

from __future__ import annotations

import numpy as np
import torch

from agentrl.algorithms.advantages import Reduce, local_sum


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438) on (B, T) tensors.

    Over the generated tokens t_1 < t_2 < ... < t_K of a row (mask == 1):
        delta_k = r_{t_k} + gamma * V_{t_{k+1}} - V_{t_k}   (V_{t_{K+1}} = 0: the episode ends)
        A_k     = delta_k + gamma * lam * A_{k+1}           (A_{K+1} = 0)
        R_k     = A_k + V_{t_k}                             (the value target)
    as verl's `compute_gae_advantage_return` (`verl/trainer/ppo/core_algos.py`), which carries the next
    value and the running advantage across observation tokens the same way. Rewards and values at
    positions with mask == 0 are ignored (place each turn's reward on that turn's last generated token,
    the final reward on the last one); advantages and returns are 0 there. No whitening here (see
    `masked_whiten`). Computed without grad, in the dtype of `values`.
    """
    with torch.no_grad():
        on = mask > 0
        zeros = torch.zeros_like(values[:, 0])
        next_value, next_advantage = zeros, zeros
        advantages = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            step = on[:, t]
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            advantage = delta + gamma * lam * next_advantage
            advantages[:, t] = torch.where(step, advantage, zeros)
            next_value = torch.where(step, values[:, t], next_value)
            next_advantage = torch.where(step, advantage, next_advantage)
        returns = torch.where(on, advantages + values, torch.zeros_like(values))
    return advantages, returns


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, reduce: Reduce = local_sum, eps: float = 1e-8
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) with mean and unbiased variance over the masked entries of the GLOBAL batch.

    PPO's advantage whitening, as verl's `masked_whiten` (`verl/utils/torch_functional.py`), but the sums
    go through `reduce` (two calls: count and sum, then squared deviations) so every trainer rank uses the
    global statistics. Entries with mask == 0 come back as 0. Fewer than two masked entries in the global
    batch: variance taken as 0.
    """
    with torch.no_grad():
        on = mask > 0
        x = values.double()
        count, total = reduce(np.array([float(on.sum()), float(torch.where(on, x, 0.0).sum())]))
        mean = total / count if count > 0 else 0.0
        (squares,) = reduce(np.array([float(torch.where(on, (x - mean) ** 2, 0.0).sum())]))
        var = squares / (count - 1.0) if count > 1 else 0.0
        whitened = (x - mean) / float(np.sqrt(var + eps))
        return torch.where(on, whitened, 0.0).to(values.dtype)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss per token: 0.5 * max((v - R)^2, (clip(v, old - c, old + c) - R)^2).

    Schulman et al. 2017 (as in OpenAI baselines' ppo2); verl `compute_value_loss`. `clip` None: the
    plain 0.5 * (v - R)^2. Returns (loss_tok, clipped_tok), not masked or reduced (use `aggregate_loss`);
    clipped_tok marks tokens where the clipped term is the larger (its gradient is then zero when v left
    the range).
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, reduce: Reduce = local_sum
) -> float:
    """1 - Var[R - V] / Var[R] over the masked tokens (of the global batch, through `reduce`, one call).

    1 is a perfect critic, 0 one no better than a constant, negative worse than that. When the returns
    have no variance (or there is no masked token) the ratio is undefined: 0.0 is returned (a metric must
    not be nan). Population variances; the ratio does not depend on that choice.
    """
    with torch.no_grad():
        on = mask > 0
        r = torch.where(on, returns.double(), 0.0)
        d = torch.where(on, returns.double() - values.double(), 0.0)
        sums = [float(on.sum()), float(r.sum()), float((r * r).sum()), float(d.sum()), float((d * d).sum())]
        count, r_sum, r_squares, d_sum, d_squares = reduce(np.array(sums))
    if count == 0:
        return 0.0
    var_returns = r_squares / count - (r_sum / count) ** 2
    var_residual = d_squares / count - (d_sum / count) ** 2
    if var_returns <= 1e-12 * max(1.0, r_squares / count):
        return 0.0
    return float(1.0 - var_residual / var_returns)
