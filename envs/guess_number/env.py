"""Guess the secret number; the env answers "higher" or "lower" after each guess.

Feedback matters: guessing blind succeeds within `max_guesses` only by luck, while a
policy that reads the replies (binary search) always succeeds when
2**max_guesses > high - low.
"""

from __future__ import annotations

import re

from agentrl.env.api import TextEnv

NUMBER = re.compile(r"-?\d+")


def parse_guess(text: str) -> int | None:
    """The first integer in the text, or None."""
    match = NUMBER.search(text)
    return int(match.group()) if match else None


class GuessNumberEnv(TextEnv):
    def __init__(self, low: int = 1, high: int = 10, max_guesses: int = 4):
        super().__init__()
        if high <= low:
            raise ValueError(f"guess_number needs low < high, got low={low} high={high}")
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.secret = None
        self.guesses = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(self.low, self.high + 1))
        self.guesses = 0
        prompt = f"Guess the number between {self.low} and {self.high}. You have {self.max_guesses} guesses."
        return prompt, {"secret": self.secret}

    def step(self, action):
        if self.secret is None:
            raise RuntimeError("step() called before reset()")
        self.guesses += 1
        guess = parse_guess(action)
        out_of_guesses = self.guesses >= self.max_guesses
        if guess == self.secret:
            return "correct", 1.0, True, False, {"success": True, "guesses": self.guesses}
        if guess is None:
            reply = f"invalid, answer with a number between {self.low} and {self.high}"
        else:
            reply = "higher" if guess < self.secret else "lower"
        return reply, 0.0, out_of_guesses, False, {"success": False, "guesses": self.guesses}
