"""PPO with a critic: per-token GAE advantages over the generated tokens of a multi-turn episode.

PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347); GAE:
Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation" (arXiv:1506.02438); as verl's `algorithm.adv_estimator=gae` with a critic.

Per step, before any update, on each trainer rank's shard:

- time steps are the generated tokens (loss mask 1); observation tokens are not steps;
- token rewards r_t: each turn's env reward (`turn_reward`) on that turn's last generated token;
  what is left of the episode's reward (a `reward_fn`, shaping) on the episode's last generated
  token, so an episode's token rewards sum to its reward (`token_rewards`);
- old values V_t: the critic's value of the state before token t (`ValueModel`: the policy's
  backbone, or `critic_path`'s, with a scalar head);
- GAE over the steps t_1 < ... < t_K of an episode (`ppo_math.gae`):
      delta_k = r_{t_k} + gamma V_{t_{k+1}} - V_{t_k},  A_k = delta_k + gamma lam A_{k+1},
      returns R_k = A_k + V_{t_k} (the value targets), V_{t_{K+1}} = A_{K+1} = 0;
- advantages whitened over the global batch (all trainer ranks), if `whiten_advantages`.

Then per micro-batch the policy loss is PPO's clipped surrogate per token,
-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) with rho = pi / pi_old (PolicyGradient's
loss: rollout correction, aggregation, KL and entropy stay available), and the critic's loss
is the clipped value loss 0.5 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2),
aggregated like the policy's. The critic has its own AdamW; the two losses share one backward
but no parameters, so no value-loss coefficient is needed (Adam does not see a constant scale).
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from agentrl.algorithms.base import ExtraModel, Place, PolicyGradient, PolicyGradientOptions, Prepared
from agentrl.algorithms.ppo_math import explained_variance, gae, masked_whiten, value_loss
from agentrl.trajectory import num_episodes

CRITIC = "critic"


def step_mask(batch: dict[str, np.ndarray], valid: np.ndarray | None = None) -> np.ndarray:
    """Flat bool: the tokens that are time steps (generated, predicted by the model, in a valid episode)."""
    offsets = batch["offsets"]
    steps = batch["loss_mask"].astype(bool)
    steps[offsets[:-1][offsets[:-1] < len(steps)]] = False  # an episode's first token has no prediction
    if valid is not None:
        steps &= np.repeat(np.asarray(valid, dtype=bool), np.diff(offsets))
    return steps


def token_rewards(batch: dict[str, np.ndarray], valid: np.ndarray | None = None) -> np.ndarray:
    """Flat float32 per-token rewards whose sum over an episode is its reward.

    Turn k's env reward goes on its last generated token (`turn_end - 1`); the episode's reward
    minus the turn rewards placed (a reward_fn's score, shaping, or a turn without a generated
    token) goes on the episode's last time step. Episodes without a time step, or not valid,
    get none.
    """
    offsets = batch["offsets"]
    n = num_episodes(batch)
    steps = step_mask(batch, valid)
    rewards = np.zeros(len(steps), dtype=np.float64)
    if not len(steps):
        return rewards.astype(np.float32)
    positions = np.where(steps, np.arange(len(steps)), -1)
    last = np.full(n, -1, dtype=np.int64)
    nonempty = np.diff(offsets) > 0
    last[nonempty] = np.maximum.reduceat(positions, offsets[:-1][nonempty])
    last[last < offsets[:-1]] = -1

    ends = np.clip(batch["turn_end"] - 1, 0, len(steps) - 1)
    placed = (batch["turn_end"] > batch["turn_start"]) & steps[ends]
    turn_reward = batch["turn_reward"].astype(np.float64)
    np.add.at(rewards, ends[placed], turn_reward[placed])
    placed_sum = np.bincount(batch["turn_episode"][placed], weights=turn_reward[placed], minlength=n)
    rest = batch["reward"].astype(np.float64) - placed_sum
    has_step = last >= 0
    np.add.at(rewards, last[has_step], rest[has_step])
    return rewards.astype(np.float32)


def to_rows(flat: np.ndarray, offsets: np.ndarray, dtype=torch.float64) -> torch.Tensor:
    """Flat per-token values as right-padded (episodes, longest) rows."""
    lengths = np.diff(offsets)
    out = torch.zeros(len(lengths), int(lengths.max(initial=0)), dtype=dtype)
    for row, (start, length) in enumerate(zip(offsets[:-1], lengths, strict=True)):
        out[row, :length] = torch.from_numpy(np.asarray(flat[start : start + length])).to(dtype)
    return out


def from_rows(rows: torch.Tensor, offsets: np.ndarray) -> np.ndarray:
    """Inverse of `to_rows`: flat float32."""
    lengths = np.diff(offsets)
    rows = rows.float().numpy()
    return np.concatenate([rows[i, :length] for i, length in enumerate(lengths)] or [np.zeros(0, np.float32)])


class PPOOptions(PolicyGradientOptions):
    name: Literal["ppo"] = "ppo"
    clip_eps_high: float = Field(0.2, ge=0, description="Ratio clip above 1 (PPO's symmetric 0.2 by default).")
    gamma: float = Field(
        1.0, ge=0, le=1, description="Discount per generated token (observation tokens are not steps)."
    )
    lam: float = Field(1.0, ge=0, le=1, description="GAE's lambda: 1 uses whole returns, 0 one-step TD errors.")
    whiten_advantages: bool = Field(
        True, description="Whiten advantages to mean 0, std 1 over the global batch (all trainer ranks)."
    )
    critic_path: str | None = Field(
        None,
        description="Folder (or hub id) of the critic's backbone: a causal LM's (its head is dropped, the value "
        "head starts at zero) or a saved critic (a checkpoint's `critic/`); None: the policy's `model.path`.",
    )
    critic_lr: float = Field(
        5e-3, gt=0, description="The critic's AdamW learning rate (constant; betas and weight decay: `optimizer`)."
    )
    critic_max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping of the critic by global norm.")
    value_clip: float | None = Field(
        0.5,
        gt=0,
        description="Clip the new value to old value +- this in the value loss (verl cliprange_value); None: no clip.",
    )


class PPO(PolicyGradient):
    """PPO with a critic (the module docstring has the definition)."""

    name = "ppo"
    summary = (
        "PPO with a critic: per-token GAE advantages, clipped surrogate and clipped value loss "
        "(Schulman et al. 2017; GAE, Schulman et al. 2016; verl adv_estimator=gae)"
    )
    Options = PPOOptions
    options: PPOOptions

    _advantages: np.ndarray | None = None

    def extra_models(self, place: Place) -> list[ExtraModel]:
        from agentrl.models.value import ValueModel, read_value_model, write_value_model

        config = self.context.config
        critic = place(ValueModel.from_pretrained(self.options.critic_path or config.model.path))
        optimizer = torch.optim.AdamW(
            [p for p in critic.parameters() if p.requires_grad],
            lr=self.options.critic_lr,
            betas=tuple(config.optimizer.betas),
            weight_decay=config.optimizer.weight_decay,
        )
        return [
            ExtraModel(
                name=CRITIC,
                module=critic,
                optimizer=optimizer,
                max_grad_norm=self.options.critic_max_grad_norm,
                write_weights=partial(write_value_model, critic),
                read_weights=read_value_model,
            )
        ]

    def prepare(self, batch, valid, forward) -> Prepared:
        reduce = self.context.reduce
        offsets = batch["offsets"]
        values = forward(CRITIC)
        steps = to_rows(step_mask(batch, valid), offsets)
        old = to_rows(values, offsets) * steps
        rewards = to_rows(token_rewards(batch, valid), offsets)
        advantages, returns = gae(rewards, old, steps, self.options.gamma, self.options.lam)
        variance = explained_variance(old, returns, steps, reduce)
        count, value_sum, return_sum = reduce(
            np.array([float(steps.sum()), float(old.sum()), float((returns * steps).sum())])
        )
        if self.options.whiten_advantages:
            advantages = masked_whiten(advantages, steps, reduce)
        self._advantages = from_rows(advantages, offsets)
        count = max(count, 1.0)
        prepared = super().prepare(batch, valid, forward)
        prepared.per_token.update(old_values=from_rows(old, offsets), returns=from_rows(returns, offsets))
        prepared.metrics.update(
            explained_variance=variance,
            value_mean=float(value_sum / count),
            return_mean=float(return_sum / count),
        )
        return prepared

    def advantages(self, batch, valid):
        if self._advantages is None or len(self._advantages) != len(batch["tokens"]):
            raise RuntimeError("PPO.advantages needs this step's prepare(batch, ...) first (the trainer calls it)")
        advantages, self._advantages = self._advantages, None
        return advantages

    def loss(self, inputs):
        loss, stats = super().loss(inputs)
        mask = inputs.mask
        old, returns = inputs.prepared["old_values"], inputs.prepared["returns"]
        value_tok, clipped = value_loss(inputs.model_outputs[CRITIC], old, returns, self.options.value_clip)
        loss = loss + self.aggregate(value_tok, mask, inputs)
        stats["value_loss"] = float((value_tok.detach() * mask).sum())
        stats["value_clip_frac"] = float((clipped * mask).sum())
        return loss, stats
