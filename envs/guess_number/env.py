"""Guess the secret number; after each guess the env answers "higher" or "lower" and,
with `show_range`, the range that is still possible ("higher, between 6 and 10"). The prompt ends
with the range too ("You have 4 guesses. The number is between 1 and 10"), so before every guess
the range sits at the same place: right before the answer.

Feedback matters: guessing blind succeeds within `max_guesses` only by luck, while a
policy that reads the replies (binary search: guess the middle of the range) always
succeeds when 2**max_guesses > high - low.

Two shapings pay for progress before the number is found. `progress_reward` pays a wrong guess by the share of the
possible numbers it rules out, on top of a win's 1, so a game won in three guesses earns more than one won in one.
`information_reward` pays every guess, the winning one included, the bits it gains (log of how much it shrinks the
range, a correct guess leaving one number) as a share of the bits the game starts with: a potential-based shaping
(Ng et al. 1999), so every win earns it in full and, within one secret, only a loss earns less.

`shift` moves each game's range up by a random 0..shift; `name_the_last` replies "lower, it is 5" instead of
"lower, between 5 and 5" once one number is left.

`info["state_key"]` is (lowest possible, highest possible, guesses left): the remaining range
and what is left to find the number in it, the whole state a turn acts in (turn-level
algorithms such as GiGPO group turns by it).
"""

from __future__ import annotations

import math
import re

from agentrl.env.api import TextEnv

NUMBER = re.compile(r"-?\d+")


def parse_guess(text: str) -> int | None:
    """The first integer in the text, or None."""
    match = NUMBER.search(text)
    return int(match.group()) if match else None


class GuessNumberEnv(TextEnv):
    reusable = True  # reset draws the secret and sets every count

    def __init__(
        self,
        low: int = 1,
        high: int = 10,
        max_guesses: int = 4,
        show_range: bool = True,
        valid_reward: float = 0.0,
        progress_reward: float = 0.0,
        shift: int = 0,
        name_the_last: bool = False,
        information_reward: float = 0.0,
    ):
        super().__init__()
        if high <= low:
            raise ValueError(f"guess_number needs low < high, got low={low} high={high}")
        if shift < 0:
            raise ValueError(f"guess_number needs shift >= 0 (how far each game's range may move up), got {shift}")
        if max_guesses < 1:
            raise ValueError(f"guess_number needs max_guesses >= 1, got {max_guesses}")
        self.low, self.high, self.max_guesses, self.show_range = low, high, max_guesses, show_range
        self.valid_reward = valid_reward  # shaping: paid for a wrong guess inside the possible range
        # shaping: paid for a wrong guess times the share of the still-possible numbers it rules out, so a guess
        # in the middle of the range earns the most (binary search's own measure of progress)
        self.progress_reward = progress_reward
        self.information_reward = information_reward
        self.name_the_last = name_the_last  # with show_range: "it is 5" instead of "between 5 and 5"
        self.shift = shift  # each game moves the range up by a random 0..shift, so no one number is always right
        self.secret = None
        self.guesses = 0
        self.possible = (low, high)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        offset = int(self.np_random.integers(0, self.shift + 1)) if self.shift else 0
        low, high = self.low + offset, self.high + offset
        self.secret = int(self.np_random.integers(low, high + 1))
        self.guesses = 0
        self.possible = (low, high)
        self.over = False
        prompt = f"You have {self.max_guesses} guesses. The number is between {low} and {high}"
        return prompt, {"secret": self.secret, "state_key": self.state_key()}

    def step(self, action):
        if self.secret is None:
            raise RuntimeError("step() called before reset()")
        if self.over:
            raise RuntimeError("step() after the episode ended; call reset() to start a new one")
        self.guesses += 1
        guess = parse_guess(action)
        out_of_guesses = self.guesses >= self.max_guesses
        self.over = out_of_guesses or guess == self.secret
        if guess == self.secret:
            reward = 1.0 + self._information(self.secret, self.secret)
            info = {"success": True, "guesses": self.guesses, "state_key": self.state_key()}
            return "correct", reward, True, False, info
        lo, hi = self.possible
        reward = self.valid_reward if guess is not None and lo <= guess <= hi else 0.0
        if guess is None:
            reply = "invalid, answer with a number"
        elif guess < self.secret:
            reply, lo = "higher", max(lo, guess + 1)
        else:
            reply, hi = "lower", min(hi, guess - 1)
        if self.progress_reward:
            before = self._count()
            reward += self.progress_reward * (before - (hi - lo + 1)) / before
        reward += self._information(lo, hi)
        self.possible = (lo, hi)
        if self.show_range:
            reply += f", it is {lo}" if self.name_the_last and lo == hi else f", between {lo} and {hi}"
        info = {"success": False, "guesses": self.guesses, "state_key": self.state_key()}
        return reply, reward, out_of_guesses, False, info

    def _information(self, lo: int, hi: int) -> float:
        """information_reward x the bits a guess gained, narrowing `self.possible` to lo..hi, over the game's bits."""
        if not self.information_reward:
            return 0.0
        return self.information_reward * math.log(self._count() / (hi - lo + 1)) / math.log(self.high - self.low + 1)

    def _count(self) -> int:
        """How many numbers are still possible."""
        return self.possible[1] - self.possible[0] + 1

    def state_key(self) -> tuple[int, int, int]:
        """(lowest possible, highest possible, guesses left)."""
        return (*self.possible, self.max_guesses - self.guesses)
