"""Group-baseline and batch-normalised policy gradients beside GRPO: Dr.GRPO, RLOO, REINFORCE++, GSPO, CISPO.

Each is GRPO's shape (agentrl/algorithms/base.py `PolicyGradient`) with one piece changed:
the advantage estimator (agentrl/algorithms/advantages.py) or the per-token surrogate
(agentrl/algorithms/losses.py). The defaults follow the paper or the peer config named in
each `summary`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from agentrl.algorithms.advantages import (
    group_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from agentrl.algorithms.base import LOSS_AGGREGATIONS, LossInputs, PolicyGradient, PolicyGradientOptions
from agentrl.algorithms.grpo import GRPO


def trained_tokens_per_episode(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Loss-mask tokens of each episode (the weights of token-level batch statistics)."""
    if len(batch["offsets"]) < 2:
        return np.zeros(0)
    return np.add.reduceat(batch["loss_mask"].astype(np.float64), batch["offsets"][:-1])


class DrGRPOOptions(PolicyGradientOptions):
    name: Literal["dr_grpo"] = "dr_grpo"
    loss_agg: Literal[LOSS_AGGREGATIONS] = Field(  # type: ignore[valid-type]
        "seq-mean-token-sum-norm",
        description="Dr.GRPO divides each sequence's token sum by one constant (loss_norm_length).",
    )


class DrGRPO(PolicyGradient):
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

    GRPO without its two length and difficulty biases: advantage = reward - group mean (no
    division by the group's std), and the loss sums each sequence's tokens and divides by a
    constant (`seq-mean-token-sum-norm`) instead of by the sequence's own length.
    """

    name = "dr_grpo"
    summary = "GRPO without std normalisation, token sums over a constant length (Liu et al. 2025; TRL dr_grpo)"
    Options = DrGRPOOptions

    def episode_advantages(self, batch, valid):
        return group_advantages(batch["reward"], batch["group"], valid, std_norm=False)


class RLOOOptions(PolicyGradientOptions):
    name: Literal["rloo"] = "rloo"


class RLOO(PolicyGradient):
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740).

    Each episode's baseline is the mean reward of the other episodes of its group (leave one
    out), an unbiased baseline; the clipped surrogate and token-mean loss as GRPO.
    """

    name = "rloo"
    summary = "leave-one-out group mean baseline (Ahmadian et al. 2024; verl adv_estimator=rloo)"
    Options = RLOOOptions

    def episode_advantages(self, batch, valid):
        return rloo_advantages(batch["reward"], batch["group"], valid)


class ReinforcePPOptions(PolicyGradientOptions):
    name: Literal["reinforce_pp"] = "reinforce_pp"


class ReinforcePP(PolicyGradient):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): returns whitened over the whole global batch.

    No per-group baseline: the episode reward (every token's return with an outcome reward and
    gamma 1) is normalised by the mean and std over all trained tokens of all trainer ranks.
    """

    name = "reinforce_pp"
    summary = "rewards whitened over the global batch, all trainer ranks (Hu 2025; verl reinforce_plus_plus)"
    Options = ReinforcePPOptions

    def episode_advantages(self, batch, valid):
        tokens = trained_tokens_per_episode(batch)
        return reinforce_pp_advantages(batch["reward"], tokens, valid, self.context.reduce)


class ReinforcePPBaselineOptions(PolicyGradientOptions):
    name: Literal["reinforce_pp_baseline"] = "reinforce_pp_baseline"


class ReinforcePPBaseline(PolicyGradient):
    """REINFORCE++-baseline (Hu 2025): the group mean subtracted first, then whitened over the global batch."""

    name = "reinforce_pp_baseline"
    summary = "group mean baseline, then global-batch whitening (Hu 2025; verl reinforce_plus_plus_baseline)"
    Options = ReinforcePPBaselineOptions

    def episode_advantages(self, batch, valid):
        tokens = trained_tokens_per_episode(batch)
        return reinforce_pp_baseline_advantages(batch["reward"], batch["group"], tokens, valid, self.context.reduce)


class GSPOOptions(PolicyGradientOptions):
    name: Literal["gspo"] = "gspo"
    clip_eps_low: float = Field(3e-4, ge=0, description="Sequence-ratio clip below 1 (the paper: 3e-4).")
    clip_eps_high: float = Field(4e-4, ge=0, description="Sequence-ratio clip above 1 (the paper: 4e-4).")
    loss_agg: Literal[LOSS_AGGREGATIONS] = Field(  # type: ignore[valid-type]
        "seq-mean-token-mean", description="GSPO averages each sequence's tokens, then the sequences."
    )
    adv_std_norm: bool = Field(True, description="Divide group-relative advantages by the group's std.")


class GSPO(GRPO):
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).

    GRPO's advantages with one length-normalised importance ratio per sequence,
    (pi/pi_old)^(1/|y|), clipped per sequence with small ranges.
    """

    name = "gspo"
    summary = "one length-normalised ratio per sequence, clipped per sequence (Zheng et al. 2025; verl gspo)"
    Options = GSPOOptions

    def token_loss(self, inputs: LossInputs):
        options = self.options
        from agentrl.algorithms.losses import gspo_loss

        return gspo_loss(
            inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask, options.clip_eps_low, options.clip_eps_high
        )


class CISPOOptions(PolicyGradientOptions):
    name: Literal["cispo"] = "cispo"
    clip_eps_low: float | None = Field(
        None, ge=0, description="Lower clip of the IS weight below 1; None: no lower bound (MiniMax-M1)."
    )
    clip_eps_high: float = Field(4.0, ge=0, description="Upper clip of the IS weight above 1 (weight <= 1 + this).")
    adv_std_norm: bool = Field(True, description="Divide group-relative advantages by the group's std.")


class CISPO(GRPO):
    """CISPO (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585): -sg(clip(ratio)) * A * log pi per token.

    The importance weight is clipped and detached, so every token keeps a gradient (PPO's clip
    drops the gradient of clipped tokens); GRPO's group advantages, token-mean loss.
    """

    name = "cispo"
    summary = "clipped stop-gradient IS weight times log-prob, no token dropped (MiniMax-M1 2025; verl cispo)"
    Options = CISPOOptions

    def token_loss(self, inputs: LossInputs):
        options = self.options
        from agentrl.algorithms.losses import cispo_loss

        return cispo_loss(inputs.logp, inputs.old_logp, inputs.advantages, options.clip_eps_low, options.clip_eps_high)
