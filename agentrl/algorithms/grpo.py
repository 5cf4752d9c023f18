"""GRPO: group-relative advantages (`advantages.group_advantages`) and PPO's clipped token loss (`losses`).

GRPO: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), section 4.1: sample a group of
episodes per task, advantage = (reward - group mean) / group std, PPO's clipped surrogate
per token. Here with clip-higher by default (DAPO's asymmetric clip, 0.2 / 0.28) and the
token-mean loss; `adv_std_norm=false` with `loss_agg=seq-mean-token-sum-norm` is Dr.GRPO.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentrl.algorithms.advantages import group_advantages
from agentrl.algorithms.base import PolicyGradient, PolicyGradientOptions


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
