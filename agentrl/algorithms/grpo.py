"""GRPO, and its pure pieces: group-relative advantages, token log-probs, the clipped loss, KL, entropy.

GRPO: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), section 4.1: sample a group of
episodes per task, advantage = (reward - group mean) / group std, PPO's clipped surrogate
per token. Here with clip-higher by default (DAPO's asymmetric clip, 0.2 / 0.28) and the
token-mean loss; `adv_std_norm=false` with `loss_agg=seq-mean-token-sum-norm` is Dr.GRPO.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from agentrl.algorithms.base import PolicyGradient, PolicyGradientOptions


def group_advantages(
    rewards: np.ndarray, groups: np.ndarray, valid: np.ndarray | None = None, std_norm: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """reward - mean(reward of its group) [/ std of the group]; invalid episodes get 0 and are left out of the stats."""
    rewards = np.asarray(rewards, dtype=np.float64)
    valid = np.ones_like(rewards, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    advantages = np.zeros_like(rewards)
    for group in np.unique(groups):
        members = (groups == group) & valid
        if members.sum() < 2:
            continue
        centred = rewards[members] - rewards[members].mean()
        if std_norm:
            centred = centred / (rewards[members].std() + eps)
        advantages[members] = centred
    return advantages.astype(np.float32)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) at `targets`; logits (..., V), targets (...)."""
    logits = logits.float() / temperature
    return torch.gather(F.log_softmax(logits, dim=-1), -1, targets.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, summed over masked tokens (caller divides by the token count).

    Returns (loss_sum, clipped_token_count).
    """
    loss, was_clipped = clipped_ratio_terms(logp, old_logp, advantages, clip_low, clip_high)
    return (loss * mask).sum(), (was_clipped * mask).sum()


def clipped_ratio_terms(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: -min(r A, clip(r, 1 - low, 1 + high) A) with r = exp(logp - old_logp), and 0/1 where the clip won.

    Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference) per token: exp(r) - r - 1 with r = ref - logp."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


class GRPOOptions(PolicyGradientOptions):
    name: Literal["grpo"] = "grpo"
    adv_std_norm: bool = Field(True, description="Divide group-relative advantages by the group's std.")


class GRPO(PolicyGradient):
    name = "grpo"
    summary = (
        "group-relative advantages, PPO-clipped token loss (Shao et al. 2024, DeepSeekMath; verl adv_estimator=grpo)"
    )
    Options = GRPOOptions
    options: GRPOOptions

    def episode_advantages(self, batch, valid):
        return group_advantages(batch["reward"], batch["group"], valid, self.options.adv_std_norm)
