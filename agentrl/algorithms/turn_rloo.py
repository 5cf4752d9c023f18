"""Per-turn returns with a leave-one-out baseline per turn position: unbiased when the agent picks its episode's length.

Each turn t of episode i is credited with its reward-to-go G_it = sum_{k >= t} gamma^(k - t) r_ik (the rewards of
its own and later turns only), minus the mean reward-to-go at the same turn position t of the OTHER episodes of its
group that reached position t:

    A_it = G_it - b_it,   b_it = mean { G_jt : j in group(i), j != i, episode j has a turn t }   (0 if there is none)

The baseline is built from other episodes only, so it is independent of episode i's actions; whether turn t of
episode i exists at all is decided by its earlier turns, before a_it is drawn. Both together keep
E[grad log pi(a_it | h_it) b_it] = 0 for every t, whatever number of turns the policy chooses (derivation:
docs/algorithms.md#per-turn-returns-turn_rloo). The turns of a gateway episode spread over several samples are
ordered by their call index (`turn_call`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from agentrl.algorithms.base import PolicyGradient, PolicyGradientOptions
from agentrl.algorithms.gigpo import checked_turns, discounted_turn_returns, per_turn_tokens


def turn_returns(turn_episode: np.ndarray, turn_position: np.ndarray, turn_reward: np.ndarray, gamma: float):
    """Each turn's reward-to-go (M,) float64: its reward plus gamma x the next turn's return, turns of one episode
    taken in the order of `turn_position` (any order in the input; a position twice in one episode is an error)."""
    order = np.lexsort((turn_position, turn_episode))
    episode, position = turn_episode[order], turn_position[order]
    if len(order) > 1 and np.any((np.diff(episode) == 0) & (np.diff(position) == 0)):
        raise ValueError("an episode has two turns at the same position: give each of its turns its own call index")
    returns = discounted_turn_returns(episode, turn_reward[order], gamma)  # in turn order now
    out = np.empty_like(returns)
    out[order] = returns
    return out


def turn_loo_advantages(
    groups: np.ndarray,
    valid: np.ndarray | None,
    turn_episode: np.ndarray,
    turn_position: np.ndarray,
    turn_reward: np.ndarray,
    gamma: float = 1.0,
    baseline: str = "reached",
) -> np.ndarray:
    """Per-turn advantages (M,) float32: A = G - (mean G of the group's other valid episodes at the same position).

    Episodes: `groups` (N,) task ids, `valid` (N,) bool (False: a failed episode; its turns get 0 and enter no
    baseline). Turns, flat (M,): `turn_episode` the episode index, `turn_position` the turn's place in its episode
    (0 first; positions of one episode distinct, not necessarily contiguous), `turn_reward` the reward paid for
    that turn (an episode's outcome on its last turn).

    `baseline`: "reached" averages the other episodes that have a turn at that position; a turn whose position no
    other valid episode of its group reached has baseline 0 (its advantage is its return). "padded" averages all
    the other valid episodes of the group, an episode that ended before that position counting a return of 0 (what
    it earns from there on); a group of one valid episode has baseline 0.
    """
    if baseline not in ("reached", "padded"):
        raise ValueError(f"baseline must be 'reached' or 'padded', got {baseline!r}")
    groups = np.asarray(groups)
    valid = np.ones(len(groups), dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    turn_episode, turn_position, turn_reward = checked_turns(
        turn_episode, turn_position, "turn_position", turn_reward, len(groups)
    )
    if len(turn_episode) == 0:
        return np.zeros(0, dtype=np.float32)
    if turn_position.min() < 0:
        raise ValueError("turn_position must be >= 0 (0: an episode's first turn)")
    returns = turn_returns(turn_episode, turn_position, turn_reward, gamma)
    _, task = np.unique(groups, return_inverse=True)
    keys = np.stack([task.reshape(-1)[turn_episode].astype(np.int64), turn_position], axis=1)
    _, cell = np.unique(keys, axis=0, return_inverse=True)
    cell = cell.reshape(-1)
    turn_valid = valid[turn_episode]
    count = np.bincount(cell, weights=turn_valid.astype(np.float64))[cell]
    total = np.bincount(cell, weights=np.where(turn_valid, returns, 0.0))[cell]
    if baseline == "padded":  # every valid episode of the group counts, those without this turn with a return of 0
        count = np.bincount(task.reshape(-1), weights=valid.astype(np.float64))[task.reshape(-1)][turn_episode]
    others = count - 1.0
    mean_of_others = np.where(others >= 1.0, (total - returns) / np.maximum(others, 1.0), 0.0)
    return np.where(turn_valid, returns - mean_of_others, 0.0).astype(np.float32)


def episode_turns(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, turn_episode, turn_reward) over the batch's episodes rather than its rows: `first` marks each
    episode's first row (a gateway episode may be several samples, packed one after another), `turn_episode` the
    episode of each turn, `turn_reward` its reward with what the episode's reward adds beyond its turns' rewards
    (an outcome, an `env.reward_fn` score) on its last turn (the highest `turn_call`), so an episode's turn rewards
    add up to its reward."""
    from agentrl.metrics import first_samples

    first = first_samples(batch)
    episode_of_row = np.cumsum(first) - 1
    turn_episode = episode_of_row[batch["turn_episode"]]
    rewards = batch["turn_reward"].astype(np.float64)
    episode_reward = batch["reward"][first].astype(np.float64)
    if len(rewards) == 0:
        return first, turn_episode, rewards
    summed = np.bincount(turn_episode, weights=rewards, minlength=len(episode_reward))
    order = np.lexsort((batch["turn_call"], turn_episode))
    last = order[np.append(turn_episode[order][1:] != turn_episode[order][:-1], True)]
    episodes = turn_episode[last]
    extra = episode_reward[episodes] - summed[episodes]
    # Below float32's resolution the difference is rounding (rewards travel as float32), not a score.
    extra[np.abs(extra) <= 1e-6 * np.maximum(1.0, np.abs(summed[episodes]))] = 0.0
    rewards[last] += extra
    return first, turn_episode, rewards


class TurnRLOOOptions(PolicyGradientOptions):
    name: Literal["turn_rloo"] = "turn_rloo"
    gamma: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Discount of later turns' rewards in a turn's return. 1: the plain reward-to-go, the gradient of "
        "the undiscounted episode reward; below 1 the estimator follows the discounted objective instead.",
    )
    baseline: Literal["reached", "padded"] = Field(
        "reached",
        description="Whose returns at a turn's position make its baseline: `reached`, the other episodes of the group "
        "that have a turn there (none: 0); `padded`, all other episodes of the group, one that already ended "
        "counting 0. Both are unbiased (docs/algorithms.md#per-turn-returns-turn_rloo).",
    )


class TurnRLOO(PolicyGradient):
    """Per-turn reward-to-go minus a leave-one-out baseline per turn position (`turn_loo_advantages`), on each
    turn's generated tokens; PPO's clipped token loss as GRPO."""

    name = "turn_rloo"
    summary = (
        "per-turn reward-to-go minus the mean return of the group's other episodes at the same turn: "
        "unbiased when the agent picks how many turns it takes (docs/algorithms.md#per-turn-returns-turn_rloo)"
    )
    Options = TurnRLOOOptions
    options: TurnRLOOOptions

    def advantages(self, batch, valid):
        first, turn_episode, turn_reward = episode_turns(batch)
        per_turn = turn_loo_advantages(
            batch["group"][first],
            valid[first],
            turn_episode,
            batch["turn_call"],
            turn_reward,
            self.options.gamma,
            self.options.baseline,
        )
        return per_turn_tokens(per_turn, batch["turn_start"], batch["turn_end"], len(batch["tokens"]))
