"""Rollout/trainer mismatch: importance weights and rejection masks from the rollout's own log-probs.

The rollout engine samples from mu (its log-probs come back with the tokens); the trainer's policy before
this step's updates, pi_old, differs from mu by numerics (kernels, precision) and, with async rollouts,
by weight versions. PPO's ratio pi / pi_old does not see that gap. Following verl's rollout correction
(`verl/trainer/ppo/rollout_corr_helper.py`, `docs/algo/rollout_corr.md`; Liu, Li et al. 2025, "When Speed
Kills Stability") the gap is corrected with the ratio rho = pi_old / mu per token or per sequence: as a
truncated importance weight on the per-token loss (TIS; Yao et al. 2025), as a rejection mask (masked
importance sampling), or both. AReaL's decoupled PPO (Fu et al. 2025) is the same weight with a proximal
policy in place of pi_old.

Sequence level here means the geometric mean of the token ratios over the masked tokens,
rho_seq = exp(mean_t log rho_t): length-normalised, so long and short episodes are judged on one scale
(verl's Geo-RS, `seq_mean_k1`). verl's sequence-level IS weight (Seq-TIS) is the product instead.
"""

from __future__ import annotations

import torch

CORRECTION_MODES = ("none", "tis", "mask", "tis_mask")
CORRECTION_LEVELS = ("token", "sequence")


def rollout_correction(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "none",
    level: str = "token",
    cap: float | None = None,
    low: float | None = None,
    high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Weights and a keep-mask for the per-token loss from rho = pi_old / mu = exp(old_logp - rollout_logp).

    Returns (weights, keep, stats): `weights` (B, T), detached, multiply the per-token loss; `keep` (B, T)
    0/1 multiplies the loss mask (so rejected tokens also leave the aggregation's token and sequence
    counts); both are neutral (1) where mask is 0. rho is per token at level "token" and the geometric mean
    over the row's masked tokens at level "sequence" (a row without masked tokens has rho = 1).

    - "none": weights 1, keep 1 (the stats still describe the gap).
    - "tis": truncated IS, weight min(rho, cap), no lower truncation (verl `rollout_is` with
      `rollout_is_threshold`); keep 1.
    - "mask": rejection only: keep 0 for tokens, or at level "sequence" for every token of the rows,
      whose rho lies outside [low, high] (bounds inclusive), weight 1 for the rest. This is verl's
      rejection sampling used alone (`rollout_rs` without `rollout_is`), where the IS weight is left out:
      the kept tokens are treated as on-policy.
    - "tis_mask": both, weight min(rho, cap) on the kept tokens (masked IS, verl's Seq-MIS preset when
      level is "sequence").

    stats are SUMS over this batch, to all-reduce over ranks and divide afterwards: "tokens" (masked
    tokens), "sequences" (rows with a masked token), "masked_tokens" and "masked_sequences" (rejected;
    a sequence counts when any of its tokens is), "capped_tokens" (kept tokens whose weight was truncated
    at cap), "is_weight_sum" (the weights summed over the kept masked tokens), "log_ratio_sum" (sum of
    log rho_t over the masked tokens).
    """
    if mode not in CORRECTION_MODES:
        raise ValueError(f"rollout correction mode {mode!r} is unknown: pick one of {', '.join(CORRECTION_MODES)}")
    if level not in CORRECTION_LEVELS:
        raise ValueError(f"rollout correction level {level!r} is unknown: pick 'token' or 'sequence'")
    weighted = mode in ("tis", "tis_mask")
    rejecting = mode in ("mask", "tis_mask")
    if weighted and (cap is None or not cap > 0):
        raise ValueError(f"rollout correction {mode!r} needs cap > 0 (got {cap}): the IS weight's upper bound, e.g. 2")
    if rejecting and (low is None or high is None or not 0 <= low < high):
        raise ValueError(
            f"rollout correction {mode!r} needs 0 <= low < high (got low={low}, high={high}): "
            "the ratio range kept, e.g. 0.5 and 2"
        )
    with torch.no_grad():
        on = mask > 0
        log_ratio = torch.where(on, old_logp.detach() - rollout_logp, torch.zeros_like(old_logp))
        if level == "token":
            ratio = torch.exp(log_ratio)
        else:
            lengths = on.sum(-1, keepdim=True).clamp(min=1)
            ratio = torch.exp(log_ratio.sum(-1, keepdim=True) / lengths).expand_as(log_ratio)
        one = torch.ones_like(log_ratio)
        keep = torch.where(on & ((ratio < low) | (ratio > high)), 0.0, one) if rejecting else one
        weights = torch.where(on, torch.clamp(ratio, max=cap), one) if weighted else one
        kept = on & (keep > 0)
        rows = on.any(-1)
        stats = {
            "tokens": float(on.sum()),
            "sequences": float(rows.sum()),
            "masked_tokens": float((on & (keep == 0)).sum()),
            "masked_sequences": float((on & (keep == 0)).any(-1).sum()),
            "capped_tokens": float((kept & (ratio > cap)).sum()) if weighted else 0.0,
            "is_weight_sum": float(torch.where(kept, weights, 0.0).sum(dtype=torch.float64)),
            "log_ratio_sum": float(log_ratio.sum(dtype=torch.float64)),
        }
    return weights.clone(), keep.clone(), stats


def mismatch_kl(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(k1_sum, k3_sum): KL(mu || pi) between the rollout's mu and the trainer's pi, from the rollout's samples.

    With d = log pi - log mu per token: k1 = -d = log mu - log pi, k3 = exp(d) - d - 1 (Schulman's
    low-variance estimator; always >= 0). Both are summed over the masked tokens in float64, to all-reduce
    and divide by the token count (verl logs their means as `kl` and `k3_kl` in `compute_offpolicy_metrics`).
    """
    with torch.no_grad():
        on = mask > 0
        d = torch.where(on, trainer_logp.detach().double() - rollout_logp.double(), 0.0)
        k3 = torch.where(on, torch.exp(d) - d - 1.0, 0.0)
        return float(-d.sum()), float(k3.sum())
