"""Relay's rules in the standard library alone, shared by the env (envs/relay/env.py) and the agent program that
plays the game through the gateway (envs/relay/agent.py, which must start fast)."""

from __future__ import annotations

import re

NUMBER = re.compile(r"\d+")


def first_number(text: str) -> int | None:
    match = NUMBER.search(text)
    return int(match.group()) if match else None


def posed_problem(proposal: str, numbers: int) -> int | None:
    """The problem a proposal poses: its first number when it is from 1 to `numbers`, else None (then the game
    draws a random problem, and the proposer earns nothing)."""
    posed = first_number(proposal)
    return posed if posed is not None and 1 <= posed <= numbers else None


def outcome(target: int, problem: int, posed: bool, answer: str) -> tuple[dict[str, float], dict[str, bool]]:
    """Each player's reward and success: the solver's for solving the problem (problem + 1), the proposer's for an
    answer that is its target, which takes a problem it posed (not a drawn one)."""
    number = first_number(answer)
    solved = number == problem + 1
    reached = posed and number == target
    return {"proposer": float(reached), "solver": float(solved)}, {"proposer": reached, "solver": solved}
