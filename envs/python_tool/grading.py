"""Grade a final answer: the last number in it (within the problem's tolerance), or its last words for text answers."""

from __future__ import annotations

import re
from decimal import Decimal

from agentrl.rewards import last_number
from envs.python_tool.problems import Problem

NOT_A_WORD_CHARACTER = re.compile(r"[^a-z0-9]+")


def normalise(text: str) -> str:
    """Lowercase words separated by single spaces, punctuation dropped."""
    return NOT_A_WORD_CHARACTER.sub(" ", text.lower()).strip()


def is_correct(problem: Problem, text: str) -> bool:
    """Whether `text`, a final answer, answers `problem`."""
    if problem.kind == "text":
        said = normalise(text)
        return said == problem.answer or said.endswith(" " + problem.answer)
    guess = last_number(text)
    return guess is not None and abs(guess - Decimal(problem.answer)) <= Decimal(str(problem.tolerance))
