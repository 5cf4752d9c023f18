"""Rewards named in the config: `env.reward_fn: module:function`, called once per finished episode.

    def exact_answer(completion: str, answer: str | None, **_) -> float:
        return float(completion.strip() == answer)

The function receives, as keyword arguments, the ones it names (or all of them if it
takes `**kwargs`):

    completion   the model's last turn (decoded text)
    task         the first observation (the task prompt)
    answer       reset info's "answer", or None when the env gives none
    transcript   [(action, observation), ...] for every turn
    env_reward   the env's summed reward
    info         the last step's info dict
    reset_info   reset's info dict
    finish       why the episode ended: terminated, truncated, max_turns or max_tokens

It returns a finite number, or a dict {"reward": number, "success": bool (optional)}. With
`env.reward_mode: replace` its reward replaces the env's; with `add` it is added.
An exception in it, or a reward that is not a finite number (NaN, inf, a string, None),
ends that episode as an error (counted in episode/failed): it never reaches the loss.

The episode loops await `scorer.score(**arguments)` and call `scorer.combine(env_reward, score)`: a
RewardFunction offers both, and so does the `reward:` section's judge or reward model
(agentrl/scoring/scorer.py), whose ScoreFailed fails the episode with its reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from agentrl.plugins import load_callable
from agentrl.scoring.score import Score, combined_reward
from agentrl.trajectory import finite_reward

ARGUMENTS = ("completion", "task", "answer", "transcript", "env_reward", "info", "reset_info", "finish")


class RewardFunction:
    """A user's reward function bound to the arguments it asks for."""

    def __init__(self, path: str, mode: str = "replace"):
        self.path, self.mode = path, mode
        self.function: Callable = load_callable(path, what="env.reward_fn")
        if not callable(self.function):
            raise TypeError(f"env.reward_fn={path!r} is not callable; point it at a function")
        self.wanted = _wanted_arguments(self.function, path)

    def __call__(self, **arguments) -> Score:
        result = self.function(**{name: arguments[name] for name in self.wanted})
        if isinstance(result, dict):
            if "reward" not in result:
                raise ValueError(f"reward_fn {self.path} returned a dict without 'reward': {result!r:.200}")
            success = result.get("success")
            return Score(_number(result["reward"], self.path), None if success is None else bool(success))
        return Score(_number(result, self.path))

    async def score(self, **arguments) -> Score:
        """The episode loops' way in (a judge's `score` awaits its endpoint; a function runs at once)."""
        return self(**arguments)

    def combine(self, env_reward: float, score: Score) -> float:
        """The episode's reward; RewardError when adding them leaves float32's range."""
        return combined_reward(self.mode, env_reward, score, f"reward_fn {self.path}")


def _wanted_arguments(function: Callable, path: str) -> tuple[str, ...]:
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return ARGUMENTS
    names = []
    for parameter in parameters:
        if parameter.name in ARGUMENTS:
            names.append(parameter.name)
        elif parameter.default is parameter.empty and parameter.kind is not parameter.VAR_POSITIONAL:
            raise TypeError(
                f"env.reward_fn={path!r} requires argument {parameter.name!r}, which agentrl does not pass; "
                f"it passes (by keyword) any of: {', '.join(ARGUMENTS)}"
            )
    return tuple(names)


def _number(value, path: str) -> float:
    return finite_reward(value, f"reward_fn {path}'s reward (what it returns, or its dict's 'reward')")
