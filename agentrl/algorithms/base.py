"""What an algorithm is to the trainer: options, advantages from a batch, a loss from log-probs.

The trainer (agentrl/trainer/policy_trainer.py) never branches on an algorithm's name. Per
step it asks the algorithm for per-token advantages of its shard of the batch, then per
micro-batch it computes the policy's log-probs and hands them to `Algorithm.loss` in a
`LossInputs`. `PolicyGradient` is the shared shape of every algorithm shipped here: a
per-token surrogate (`token_loss`), rollout/trainer mismatch correction, loss aggregation,
an optional k3 KL to a frozen reference and an entropy bonus. A new algorithm subclasses
it and overrides `advantages` and/or `token_loss`; one with a different shape overrides
`loss` itself. Register it by name (agentrl/algorithms/registry.py) or name it in the
config as `algorithm.name: package.module:Class`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from agentrl.config import AlgorithmSection as AlgorithmOptions
from agentrl.config import Section

Reduce = Callable[[np.ndarray], np.ndarray]  # sums a float64 array over trainer ranks

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class CorrectionOptions(Section):
    """Rollout/trainer mismatch correction with the rollout engine's own per-token log-probs (mu).

    Off (`none`), the rollout's log-probs serve as the old policy. On, the trainer recomputes
    the old policy's log-probs (one extra forward pass per step) and weights or masks each
    token by pi_old / mu.
    """

    mode: Literal["none", "tis", "mask"] = Field(
        "none",
        description="`tis`: truncated importance sampling, weight min(pi_old/mu, cap); "
        "`mask`: drop tokens (or sequences) whose ratio leaves [low, high]; `none`: neither.",
    )
    level: Literal["token", "sequence"] = Field(
        "token", description="Ratio per token, or per sequence (geometric mean of its token ratios)."
    )
    cap: float = Field(2.0, gt=0, description="`tis`: the largest importance weight.")
    low: float = Field(0.5, ge=0, description="`mask`: smallest ratio kept.")
    high: float = Field(2.0, gt=0, description="`mask`: largest ratio kept.")


class PolicyGradientOptions(AlgorithmOptions):
    clip_eps_low: float = Field(0.2, ge=0, description="Ratio clip below 1.")
    clip_eps_high: float = Field(0.28, ge=0, description="Ratio clip above 1 (clip-higher).")
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL penalty to a frozen reference model; 0 loads none."
    )
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    loss_agg: Literal[LOSS_AGGREGATIONS] = Field(  # type: ignore[valid-type]
        "token-mean",
        description="How per-token losses become one number: over all tokens, or per sequence then over sequences.",
    )
    loss_norm_length: int | None = Field(
        None,
        ge=1,
        description="`seq-mean-token-sum-norm`: the constant a sequence's token sum is divided by; "
        "None: rollout.max_episode_tokens.",
    )
    correction: CorrectionOptions = Field(default_factory=CorrectionOptions)


@dataclass
class AlgorithmContext:
    """What an algorithm may read of the run besides its own options."""

    config: object  # the whole agentrl.config.Config
    reduce: Reduce  # sum over trainer ranks (identity with one)


@dataclass
class LossInputs:
    """One micro-batch, rows = whole episodes, shifted so position t predicts token t+1. All (B, T)."""

    logp: torch.Tensor  # current policy, with grad
    old_logp: torch.Tensor  # the policy that generated the batch as the trainer sees it (mu when not recomputed)
    rollout_logp: torch.Tensor  # mu: the rollout engine's own log-probs
    advantages: torch.Tensor
    mask: torch.Tensor  # 1.0 on trained (generated) tokens
    entropy: torch.Tensor | None  # per-token entropy, with grad when an entropy bonus is asked for
    ref_logp: torch.Tensor | None  # frozen reference policy, when `needs_reference`
    global_tokens: float  # trained tokens in the whole global mini-batch
    global_sequences: float  # episodes with at least one trained token in it


class Algorithm:
    """Subclass, set the class attributes, and override the hooks that differ."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""  # one line: what it is and the paper or peer config it follows
    Options: ClassVar[type[AlgorithmOptions]] = AlgorithmOptions

    def __init__(self, options: AlgorithmOptions, context: AlgorithmContext):
        self.options = options
        self.context = context

    @property
    def needs_reference(self) -> bool:
        """Load a frozen copy of the initial policy for `LossInputs.ref_logp`."""
        return False

    @property
    def needs_old_logprobs(self) -> bool:
        """Recompute the old policy's log-probs with the trainer before the step's updates."""
        return False

    @property
    def needs_entropy_grad(self) -> bool:
        return False

    def keep_group(self, rewards: np.ndarray) -> bool:
        """Rollout side: whether a finished group of episodes enters the batch (dynamic sampling).

        `rewards`: float32, the group's episodes that did not fail (an env error), in order.
        """
        return True

    @property
    def max_extra_rounds(self) -> int:
        """Rollout side: rounds of fresh tasks a rollout rank may add when `keep_group` dropped groups."""
        return 0

    def advantages(self, batch: dict[str, np.ndarray], valid: np.ndarray) -> np.ndarray:
        """Per-token advantages, float32, aligned with batch["tokens"]; 0 on invalid episodes."""
        raise NotImplementedError

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """(scalar to backpropagate, stats). The scalars of all micro-batches and ranks add up to the batch loss.

        Stats are sums over this micro-batch (the trainer adds them over micro-batches and
        ranks, then divides by the trained-token count), except keys ending in `_seq`, which
        it divides by the sequence count.
        """
        raise NotImplementedError


class PolicyGradient(Algorithm):
    """Clipped-ratio policy gradient with correction, aggregation, KL and entropy; subclasses pick the pieces."""

    Options = PolicyGradientOptions
    options: PolicyGradientOptions

    @property
    def needs_reference(self) -> bool:
        return self.options.kl_coef > 0

    @property
    def needs_old_logprobs(self) -> bool:
        return self.options.correction.mode != "none"

    @property
    def needs_entropy_grad(self) -> bool:
        return self.options.entropy_coef > 0

    def episode_advantages(self, batch: dict[str, np.ndarray], valid: np.ndarray) -> np.ndarray:
        """One value per episode; `advantages` spreads it over the episode's tokens."""
        raise NotImplementedError

    def advantages(self, batch, valid):
        return per_token(self.episode_advantages(batch, valid), batch["offsets"])

    def token_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token loss, 0/1 where clipping was active), both (B, T), before masking."""
        from agentrl.algorithms.grpo import clipped_ratio_terms

        return clipped_ratio_terms(
            inputs.logp, inputs.old_logp, inputs.advantages, self.options.clip_eps_low, self.options.clip_eps_high
        )

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        from agentrl.algorithms.grpo import kl_k3

        options = self.options
        mask = inputs.mask
        stats: dict[str, float] = {}
        token_loss, clipped = self.token_loss(inputs)
        if options.correction.mode != "none":
            from agentrl.algorithms.correction import rollout_correction

            weights, keep, correction_stats = rollout_correction(
                inputs.old_logp,
                inputs.rollout_logp,
                mask,
                options.correction.mode,
                options.correction.level,
                options.correction.cap,
                options.correction.low,
                options.correction.high,
            )
            token_loss = token_loss * weights
            mask = mask * keep
            stats.update({f"correction_{key}": value for key, value in correction_stats.items()})
        if inputs.ref_logp is not None:
            kl = kl_k3(inputs.logp, inputs.ref_logp)
            token_loss = token_loss + options.kl_coef * kl
            stats["kl"] = float((kl.detach() * mask).sum())
        if options.entropy_coef > 0:
            token_loss = token_loss - options.entropy_coef * inputs.entropy
        loss = self.aggregate(token_loss, mask, inputs)
        stats["loss_sum"] = float((token_loss.detach() * mask).sum())
        stats["clip_frac"] = float((clipped * mask).sum())
        return loss, stats

    def aggregate(self, token_loss: torch.Tensor, mask: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
        mode = self.options.loss_agg
        if mode == "token-mean":
            return (token_loss * mask).sum() / inputs.global_tokens
        from agentrl.algorithms.losses import aggregate_loss

        norm_length = self.options.loss_norm_length or self.context.config.rollout.max_episode_tokens
        return aggregate_loss(token_loss, mask, mode, inputs.global_tokens, inputs.global_sequences, norm_length)


def per_token(episode_values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Repeat each episode's value over its tokens: the layout of batch["tokens"]."""
    return np.repeat(np.asarray(episode_values, dtype=np.float32), np.diff(offsets))


def valid_episodes(batch: dict[str, np.ndarray]) -> np.ndarray:
    from agentrl.trajectory import FINISH_REASONS

    return batch["finish"] != FINISH_REASONS.index("error")
