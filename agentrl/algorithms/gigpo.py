"""GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978).

Two nested group-relative advantages, no critic. The episode level is GRPO's: the episodes of one task are
a group. The step level regroups turns: across the episodes of one task, the turns that acted in the same
environment state (an "anchor state", recognised by a hash of the observation) form a step group, and
each turn's discounted return is normalised within it. Reference implementation: verl-agent
(langfengQ/verl-agent, `gigpo/core_gigpo.py`: `compute_gigpo_outcome_advantage`, `build_step_group`,
`step_norm_reward`, `compute_step_discounted_returns`); ROLL ships it as `adv_estimator: gigpo`.

`GiGPO` below is the algorithm: each turn's advantage (`gigpo_advantages`) on that turn's generated
tokens, PPO's clipped token loss. The anchor state of a turn is the env's `info["state_key"]` (reset
info for the first turn, the previous step's info after that), else the observation text the turn
answered (agentrl/rollout/agent_loop.py), hashed into the batch's `turn_state`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
from pydantic import Field

from agentrl.algorithms.advantages import group_advantages
from agentrl.algorithms.base import PolicyGradient, PolicyGradientOptions


def _group_relative(
    values: np.ndarray, ids: np.ndarray, valid: np.ndarray, std_norm: bool, eps: float = 1e-6
) -> np.ndarray:
    """GRPO's normalisation (`group_advantages`: mean, population std + eps, groups of fewer than two valid
    members get 0) for many small groups at once: bincount instead of one pass per group."""
    weight = valid.astype(np.float64)
    count = np.bincount(ids, weights=weight)
    safe = np.maximum(count, 1.0)
    mean = np.bincount(ids, weights=weight * values) / safe
    centred = values - mean[ids]
    if std_norm:
        std = np.sqrt(np.bincount(ids, weights=weight * centred**2) / safe)
        centred = centred / (std[ids] + eps)
    return np.where(valid & (count[ids] >= 2), centred, 0.0)


def discounted_turn_returns(turn_episode: np.ndarray, turn_reward: np.ndarray, gamma: float) -> np.ndarray:
    """sum_k gamma^k r_{t+k} over the later turns of the same episode (turns contiguous and in order)."""
    returns = np.zeros(len(turn_reward), dtype=np.float64)
    running = 0.0
    for m in reversed(range(len(turn_reward))):
        if m + 1 == len(turn_reward) or turn_episode[m + 1] != turn_episode[m]:
            running = 0.0
        running = float(turn_reward[m]) + gamma * running
        returns[m] = running
    return returns


class Turns(NamedTuple):
    """A batch's turns, flat (M,): `episode` the episode index of each turn (an episode's turns contiguous and in
    order), `state` the int64 hash of the state the turn acted in (the observation before its action), `reward`
    the reward the env returned for that turn."""

    episode: np.ndarray
    state: np.ndarray
    reward: np.ndarray


def checked_turns(
    turn_episode, turn_key, key_name: str, turn_reward, episodes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch's flat per-turn arrays as (int64, int64, float64): each turn's episode index (below `episodes`), its
    key (`key_name`: its state, its position) and its reward; a ValueError naming the fields when they do not fit."""
    turn_episode = np.asarray(turn_episode, dtype=np.int64)
    turn_key = np.asarray(turn_key, dtype=np.int64)
    turn_reward = np.asarray(turn_reward, dtype=np.float64)
    if not (len(turn_episode) == len(turn_key) == len(turn_reward)):
        raise ValueError(
            f"turn_episode, {key_name}, turn_reward have lengths {len(turn_episode)}, {len(turn_key)}, "
            f"{len(turn_reward)}: pass one entry per turn in each"
        )
    if len(turn_episode) and (turn_episode.min() < 0 or turn_episode.max() >= episodes):
        raise ValueError(f"turn_episode must index the {episodes} episodes (0..{episodes - 1})")
    return turn_episode, turn_key, turn_reward


def gigpo_advantages(
    rewards: np.ndarray,
    groups: np.ndarray,
    valid: np.ndarray | None,
    turns: Turns,
    gamma: float,
    step_weight: float = 1.0,
    std_norm: bool = True,
) -> np.ndarray:
    """Per-turn advantages (M,) float32: A = A_episode + step_weight * A_step.

    Episodes: `rewards`, `groups` (task ids), `valid` (N,) as in `advantages.group_advantages`. Turns: `turns`.

    - A_episode: `group_advantages(rewards, groups, valid, std_norm)` of the turn's episode, one value per
      episode (verl-agent computes these statistics over its rows, one per turn, so longer episodes weigh
      more there; a one-episode group gets 0 here and its raw reward there).
    - A_step: the discounted return from the turn onwards, R_t = sum_k gamma^k r_{t+k}, normalised the
      same way within its step group: all turns of the valid episodes of the same task group whose
      `turn_state` is equal (repeated visits within one episode included, as verl-agent's
      `build_step_group`). A step group of one turn gets 0.

    Normalisation: both levels subtract the group mean and, when `std_norm`, divide by the group's std
    + 1e-6: verl-agent's `mode` "mean_std_norm" (std_norm=True; the default in its `ppo_trainer.yaml`)
    or "mean_norm" (std_norm=False; the default argument of its `compute_gigpo_outcome_advantage`, the
    Dr. GRPO-like variant), one mode for both levels. Population std as GRPO here; verl-agent's
    torch.std is the unbiased one. verl-agent's weight (`step_advantage_w`) is 1.0, gamma 0.95 in its
    example scripts. Invalid episodes' turns get 0 and enter no statistic.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    groups = np.asarray(groups)
    valid = np.ones(rewards.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    turn_episode, turn_state, turn_reward = checked_turns(
        turns.episode, turns.state, "turn_state", turns.reward, len(rewards)
    )
    if len(turn_episode) == 0:
        return np.zeros(0, dtype=np.float32)
    runs = 1 + int(np.count_nonzero(np.diff(turn_episode)))
    if runs != len(np.unique(turn_episode)):
        raise ValueError("an episode's turns must be contiguous in turn_episode: order the turns episode by episode")

    episode = group_advantages(rewards, groups, valid, std_norm).astype(np.float64)
    returns = discounted_turn_returns(turn_episode, turn_reward, gamma)
    _, task = np.unique(groups, return_inverse=True)
    keys = np.stack([task.reshape(-1)[turn_episode].astype(np.int64), turn_state], axis=1)
    _, step_group = np.unique(keys, axis=0, return_inverse=True)
    turn_valid = valid[turn_episode]
    step = _group_relative(returns, step_group.reshape(-1), turn_valid, std_norm)
    advantages = np.where(turn_valid, episode[turn_episode] + step_weight * step, 0.0)
    return advantages.astype(np.float32)


def per_turn_tokens(turn_values: np.ndarray, turn_start: np.ndarray, turn_end: np.ndarray, tokens: int) -> np.ndarray:
    """(tokens,) float32: each turn's value on its generated tokens [turn_start, turn_end), 0 elsewhere."""
    turn_start = np.asarray(turn_start, dtype=np.int64)
    lengths = np.asarray(turn_end, dtype=np.int64) - turn_start
    out = np.zeros(tokens, dtype=np.float32)
    turn = np.repeat(np.arange(len(lengths)), lengths)
    within = np.arange(len(turn)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[turn_start[turn] + within] = np.asarray(turn_values, dtype=np.float32)[turn]
    return out


def turn_rewards_with_final(batch: dict[str, np.ndarray]) -> np.ndarray:
    """The env's per-turn rewards, with what the episode reward adds beyond their sum (an `env.reward_fn`
    score) on the episode's last turn, so the turn returns add up to the reward the episode level uses."""
    turn_episode = batch["turn_episode"]
    rewards = batch["turn_reward"].astype(np.float64)
    if len(rewards) == 0:
        return rewards
    summed = np.bincount(turn_episode, weights=rewards, minlength=len(batch["reward"]))
    last = np.flatnonzero(np.append(turn_episode[1:] != turn_episode[:-1], True))
    episodes = turn_episode[last]
    extra = batch["reward"][episodes].astype(np.float64) - summed[episodes]
    # Below float32's resolution the difference is rounding (rewards travel as float32), not a score.
    extra[np.abs(extra) <= 1e-6 * np.maximum(1.0, np.abs(summed[episodes]))] = 0.0
    rewards[last] += extra
    return rewards


class GiGPOOptions(PolicyGradientOptions):
    name: Literal["gigpo"] = "gigpo"
    gamma: float = Field(
        0.95, ge=0, le=1, description="Discount of later turns' rewards in a turn's return (verl-agent's gamma)."
    )
    step_weight: float = Field(
        1.0,
        ge=0,
        description="Weight of the step-level (anchor-state) advantage added to the episode-level one "
        "(verl-agent's step_advantage_w).",
    )
    std_norm: bool = Field(
        True,
        description="Divide by the group's std at both levels (verl-agent mode mean_std_norm); false: only "
        "subtract the mean (mean_norm).",
    )


class GiGPO(PolicyGradient):
    """Per-turn advantages A = A_episode + step_weight x A_step (`gigpo_advantages`) on each turn's tokens."""

    name = "gigpo"
    summary = (
        "episode-level plus anchor-state step-level group advantages per turn (Feng et al. 2025, GiGPO, "
        "arXiv:2505.10978; verl-agent gigpo, ROLL adv_estimator=gigpo)"
    )
    Options = GiGPOOptions
    options: GiGPOOptions

    def advantages(self, batch, valid):
        per_turn = gigpo_advantages(
            batch["reward"],
            batch["group"],
            valid,
            Turns(batch["turn_episode"], batch["turn_state"], turn_rewards_with_final(batch)),
            self.options.gamma,
            self.options.step_weight,
            self.options.std_norm,
        )
        return per_turn_tokens(per_turn, batch["turn_start"], batch["turn_end"], len(batch["tokens"]))
