"""Reward functions the qa env grades answers with, by name: agentrl.rewards' ready-made ones or `module:function`."""

from __future__ import annotations

import functools

from agentrl.rollout.reward_hook import RewardFunction

NAMED = ("exact_match", "number_match", "token_f1", "contains", "math_verify")


@functools.cache
def reward_by_name(name: str, field: str = "env.kwargs.reward_fn") -> RewardFunction:
    """A grader of agentrl/rewards.py by name (NAMED) or a `module:function` path; one per name and process (a
    RewardFunction holds no state, and an env made per episode would otherwise look its function up each time)."""
    if ":" not in name and name not in NAMED:
        raise ValueError(f"{field}={name!r} names no reward function; use one of {', '.join(NAMED)} or module:function")
    return RewardFunction(name if ":" in name else f"agentrl.rewards:{name}")
