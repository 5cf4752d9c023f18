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

Algorithms that train a model of their own beside the policy (PPO's critic) use two more
hooks, both no-ops by default:

- `extra_models(place)`, once at start-up: the models to train, each an `ExtraModel` (a
  module mapping token ids to one output per position, its optimizer, its gradient-clip
  norm, how to write and read its weights). `place` puts a freshly loaded module on the
  trainer's device and dtype, with activation checkpointing and FSDP2 sharding as the
  `parallelism` section asks. The trainer then runs each one in every micro-batch (its
  outputs reach `loss` as `LossInputs.model_outputs[name]`), syncs its gradients over the
  trainer ranks as the policy's, clips them, steps its optimizer, and checkpoints it in the
  step folder's `NAME/` subfolder.
- `prepare(batch, valid, forward)`, once per step before `advantages`: `forward(name)` is
  that model's output for every token of this rank's shard before the step's updates (no
  grad). It returns a `Prepared`: per-token arrays whose micro-batch rows reach `loss` as
  `LossInputs.prepared[name]`, and metrics logged as `train/NAME`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from agentrl.sections import AlgorithmSection as AlgorithmOptions
from agentrl.sections import Section

if TYPE_CHECKING:  # torch loads with the trainer: validating a config (any rank's first act) does without it
    import torch

Reduce = Callable[[np.ndarray], np.ndarray]  # sums a float64 array over trainer ranks

CORRECTION_STATS = ("masked_tokens", "capped_tokens", "is_weight_sum")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class CorrectionOptions(Section):
    """Rollout/trainer mismatch correction with the rollout engine's own per-token log-probs (mu).

    Off (`none`), the rollout's log-probs serve as the old policy. On, the old policy's log-probs are the
    trainer's own before the step's updates (with trainer.updates_per_step=1, each micro-batch's forward; with
    more updates, one extra forward pass per step) and each token is weighted or masked by pi_old / mu.
    """

    mode: Literal["none", "tis", "mask", "tis_mask"] = Field(
        "none",
        description="`tis`: truncated importance sampling, weight min(pi_old/mu, cap); "
        "`mask`: drop tokens (or sequences) whose ratio leaves [low, high]; `tis_mask`: both; `none`: neither.",
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
    entropy_floor: float | None = Field(
        None,
        gt=0,
        description="With entropy_coef: the bonus is entropy_coef x min(entropy, entropy_floor) per token, so it acts "
        "only where a token's entropy (nats) fell below the floor: it keeps the policy from going deterministic "
        "without pulling a high-entropy policy toward uniform. None: the plain bonus on every token.",
    )
    entropy_schedule: Literal["constant", "lr"] = Field(
        "constant",
        description="`lr`: the entropy bonus follows the learning-rate schedule (entropy_coef x lr / peak lr), so "
        "it fades as the lr decays and the policy may sharpen at the end; `constant`: entropy_coef throughout.",
    )
    entropy_on: Literal["all", "failed"] = Field(
        "all",
        description="`failed`: the entropy bonus only on the tokens of episodes that failed (the env's `success` is "
        "false), so a state keeps exploring while the games through it are lost and may sharpen once they are won; "
        "`all`: on every trained token.",
    )
    entropy_measure: Literal["shannon", "uniform_kl"] = Field(
        "shannon",
        description="What the bonus raises. `shannon`: the next-token distribution's entropy, whose pull on a token "
        "shrinks with the token's probability, so a token the policy stopped sampling stays unsampled; "
        "`uniform_kl`: minus the KL from the uniform distribution over the vocabulary to the policy (the mean "
        "log-probability over the vocabulary, plus log V), which pulls every logit toward their mean with a force "
        "that does not shrink with the probability (label smoothing), so it revives such tokens. With entropy_floor, "
        "either acts only on tokens whose entropy fell below the floor.",
    )
    loss_agg: Literal[LOSS_AGGREGATIONS] = Field(  # type: ignore[valid-type]
        "token-mean",
        description="How per-token losses become one number: over all tokens, or per sequence then over sequences.",
    )
    loss_norm_length: int | None = Field(
        None,
        ge=1,
        description="`seq-mean-token-sum-norm`: the constant a sequence's token sum is divided by; "
        "None: the episode's generation budget, min(max_new_tokens x max_turns, max_episode_tokens) of `rollout`.",
    )
    correction: CorrectionOptions = Field(default_factory=CorrectionOptions)

    @model_validator(mode="after")
    def _floor_needs_a_bonus(self) -> PolicyGradientOptions:
        def refuse(what: str, verb: str, field: str):
            raise ValueError(
                f"{what} the entropy bonus, and algorithm.entropy_coef is 0, so there is no bonus to {verb}; set "
                f"entropy_coef (e.g. 0.2) or drop {field}"
            )

        if self.entropy_coef > 0:
            return self
        if self.entropy_floor is not None:
            refuse("algorithm.entropy_floor caps", "cap", "entropy_floor")
        if self.entropy_schedule != "constant":
            refuse(f"algorithm.entropy_schedule={self.entropy_schedule} scales", "schedule", "entropy_schedule")
        if self.entropy_on != "all":
            refuse(f"algorithm.entropy_on={self.entropy_on} places", "place", "entropy_on")
        if self.entropy_measure != "shannon":
            refuse(f"algorithm.entropy_measure={self.entropy_measure} picks", "measure", "entropy_measure")
        return self


@dataclass
class AlgorithmContext:
    """What an algorithm may read of the run besides its own options."""

    config: object  # the whole agentrl.config.Config
    reduce: Reduce  # sum over trainer ranks (identity with one)


@dataclass
class LossInputs:
    """One micro-batch, rows = whole episodes, shifted so position t predicts token t+1. All (B, T). The policy's
    values (`logp`, `entropy`, `ref_logp`, `uniform_kl`, and `old_logp` where recomputed) are computed where `mask` is
    1; elsewhere they hold another position's (the trainer forwards only the positions that predict a trained token)."""

    logp: torch.Tensor  # current policy, with grad
    old_logp: torch.Tensor  # the policy that generated the batch as the trainer sees it (mu when not recomputed)
    rollout_logp: torch.Tensor  # mu: the rollout engine's own log-probs
    advantages: torch.Tensor
    mask: torch.Tensor  # 1.0 on trained (generated) tokens
    entropy: torch.Tensor | None  # per-token entropy; with grad only when `needs_entropy_grad`, else detached
    ref_logp: torch.Tensor | None  # frozen reference policy, when `needs_reference`
    global_tokens: float  # trained tokens in the whole global mini-batch
    global_sequences: float  # episodes with at least one trained token in it
    model_outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # each ExtraModel's output, with grad
    prepared: dict[str, torch.Tensor] = field(default_factory=dict)  # Prepared.per_token rows of this micro-batch
    lr_scale: float = 1.0  # the scheduler's factor this step: lr / peak lr
    uniform_kl: torch.Tensor | None = None  # per-token KL(uniform || policy), with grad, when `needs_uniform_kl`


Forward = Callable[[str], np.ndarray]  # ExtraModel name -> its flat per-token output, no grad (see `prepare`)
Place = Callable[["torch.nn.Module"], "torch.nn.Module"]  # see `Algorithm.extra_models`


@dataclass
class Prepared:
    """What `Algorithm.prepare` hands the trainer for one step."""

    per_token: dict[str, np.ndarray] = field(default_factory=dict)  # flat like batch["tokens"]; float32
    metrics: dict[str, float] = field(default_factory=dict)  # logged as train/NAME; already global (reduce)


@dataclass
class ExtraModel:
    """A model an algorithm trains beside the policy (PPO's critic); the trainer does the rest.

    `module(input_ids=..., attention_mask=...)` returns (B, T) float: one output per
    position, the output at position t belonging to token t+1 (as logits do). The trainer
    shifts it like the policy's log-probs: `LossInputs.model_outputs[name]` and `prepare`'s
    `forward(name)` line up with the tokens they predict. The loss adds this model's term to
    the policy's, so one backward reaches both. Per optimizer step the trainer syncs its
    gradients over trainer ranks (by hand for replicas, FSDP2 when sharded), clips them to
    `max_grad_norm` (logged as train/NAME_grad_norm) and steps `optimizer` (no LR schedule).
    Build the optimizer over the parameters of the module `place` returned.

    Checkpoints: agentrl/trainer/checkpoint.py writes and reads it in the step folder's `NAME/`
    subfolder (the weights through `write_weights(state_dict, folder)` / `read_weights(folder) ->
    state_dict`, full and unsharded, plus the optimizer state in `optimizer.pt`).
    """

    name: str
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    max_grad_norm: float
    write_weights: Callable[[dict[str, torch.Tensor], Path], None]
    read_weights: Callable[[Path], dict[str, torch.Tensor]]


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

    @property
    def needs_uniform_kl(self) -> bool:
        """Fill `LossInputs.uniform_kl` (with grad)."""
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

    def extra_models(self, place: Place) -> list[ExtraModel]:
        """Once, when the trainer starts: models trained beside the policy (a critic). None by default.

        `place(module)` moves a freshly loaded module (on CPU) to the trainer's device and
        parameter dtype, enables activation checkpointing on its `base_model` and shards it with
        FSDP2 when `parallelism` asks, and returns it; build each optimizer after placing.
        """
        return []

    def prepare(self, batch: dict[str, np.ndarray], valid: np.ndarray, forward: Forward) -> Prepared:
        """Once per step, before `advantages` and any update (PPO's old values, GAE, returns).

        `forward(name)` runs that extra model over this rank's shard (no grad) and returns its
        flat per-token output, float32, aligned with batch["tokens"] (0 at each episode's first
        token, which nothing predicts). Statistics over the global batch go through
        `self.context.reduce`; every rank must make the same calls.
        """
        return Prepared()

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
        """The Shannon bonus raises the entropy itself; `uniform_kl` reads it only as the floor's gate."""
        return self.options.entropy_coef > 0 and self.options.entropy_measure == "shannon"

    @property
    def needs_uniform_kl(self) -> bool:
        return self.options.entropy_coef > 0 and self.options.entropy_measure == "uniform_kl"

    def prepare(self, batch, valid, forward) -> Prepared:
        if self.options.entropy_coef == 0 or self.options.entropy_on == "all":
            return Prepared()
        from agentrl.metrics import first_samples

        failed = valid & ~batch["success"].astype(bool)
        first = first_samples(batch)
        counts = self.context.reduce(np.array([float((failed & first).sum()), float((valid & first).sum())]))
        return Prepared(
            per_token={"entropy_weight": per_token(failed.astype(np.float32), batch["offsets"])},
            metrics={"entropy_on_share": float(counts[0] / max(counts[1], 1.0))},
        )

    def episode_advantages(self, batch: dict[str, np.ndarray], valid: np.ndarray) -> np.ndarray:
        """One value per episode; `advantages` spreads it over the episode's tokens."""
        raise NotImplementedError

    def advantages(self, batch, valid):
        """Per-token advantages; an episode of several samples (agentrl/gateway/trace.py) enters the group's
        statistics once, and each of its samples takes its advantage."""
        from agentrl.metrics import first_samples

        first = first_samples(batch)
        if first.all():
            return per_token(self.episode_advantages(batch, valid), batch["offsets"])
        from agentrl.trajectory import select_episodes

        values = self.episode_advantages(select_episodes(batch, first), valid[first])
        return per_token(np.asarray(values)[np.cumsum(first) - 1], batch["offsets"])

    def token_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token loss, 0/1 where clipping was active), both (B, T), before masking."""
        from agentrl.algorithms.losses import clipped_ratio_terms

        return clipped_ratio_terms(
            inputs.logp, inputs.old_logp, inputs.advantages, self.options.clip_eps_low, self.options.clip_eps_high
        )

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        from agentrl.algorithms.losses import kl_k3

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
            for key in CORRECTION_STATS:  # sums; the trainer divides them by the trained tokens
                stats[f"correction_{key}"] = correction_stats[key]
        if inputs.ref_logp is not None:
            kl = kl_k3(inputs.logp, inputs.ref_logp)
            token_loss = token_loss + options.kl_coef * kl
            stats["kl"] = float((kl.detach() * mask).sum())
        if options.entropy_coef > 0:
            bonus = entropy_bonus(inputs, options.entropy_measure, options.entropy_floor)
            scale = inputs.lr_scale if options.entropy_schedule == "lr" else 1.0
            if "entropy_weight" in inputs.prepared:
                bonus = bonus * inputs.prepared["entropy_weight"]
            token_loss = token_loss - options.entropy_coef * scale * bonus
        loss = self.aggregate(token_loss, mask, inputs)
        stats["loss_sum"] = float((token_loss.detach() * mask).sum())
        stats["clip_frac"] = float((clipped * mask).sum())
        return loss, stats

    def aggregate(self, token_loss: torch.Tensor, mask: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
        from agentrl.algorithms.losses import aggregate_loss

        norm_length = self.options.loss_norm_length or generation_budget(self.context.config.rollout)
        return aggregate_loss(
            token_loss, mask, self.options.loss_agg, inputs.global_tokens, inputs.global_sequences, norm_length
        )


def entropy_bonus(inputs: LossInputs, measure: str, floor: float | None) -> torch.Tensor:
    """The per-token quantity the entropy bonus raises (see PolicyGradientOptions.entropy_measure)."""
    if measure == "shannon":
        return inputs.entropy if floor is None else inputs.entropy.clamp(max=floor)
    bonus = -inputs.uniform_kl
    return bonus if floor is None else bonus * (inputs.entropy < floor)


def generation_budget(rollout) -> int:
    """The most tokens one episode can generate: Dr.GRPO's constant normaliser by default."""
    return min(rollout.max_new_tokens * rollout.max_turns, rollout.max_episode_tokens)


def per_token(episode_values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Repeat each episode's value over its tokens: the layout of batch["tokens"]."""
    return np.repeat(np.asarray(episode_values, dtype=np.float32), np.diff(offsets))


def valid_episodes(batch: dict[str, np.ndarray]) -> np.ndarray:
    from agentrl.trajectory import FINISH_REASONS

    return batch["finish"] != FINISH_REASONS.index("error")
