"""Nim for two players, "0" and "1" (the env names whose turn it is in info["player"], as PettingZoo's AEC API and
TextArena do): one pile of `low..high` stones, each turn a player takes 1 to `max_take`; whoever takes the last
stone wins. A move that is not a number from 1 to what is allowed loses the game at once (`invalid="lose"`) or
takes one stone (`invalid="take_one"`: every answer is then a move, so a policy that explores does not lose
by it, which a tiny model learning from scratch needs).

Leaving the other player a multiple of `max_take + 1` wins every game from a pile that is not one; a player that
moves at random wins about half. `random_move` and `take_one` are fixed programs to measure a policy against.

Rewards are per player, in info["rewards"] at the end: +1 to the winner, -1 to the loser (`reward`, the scalar,
is the mover's). info["winner"] names the winner.
"""

from __future__ import annotations

import random
import re

from agentrl.env.api import TextEnv

NUMBER = re.compile(r"\d+")
PLAYERS = ("0", "1")


def parse_take(text: str) -> int | None:
    match = NUMBER.search(text)
    return int(match.group()) if match else None


def pile_of(observation: str) -> int:
    """The stones left, read from an observation ("... take 1-3, 7 left")."""
    return int(re.search(r"(\d+) left", observation).group(1))


def random_move(observation: str, rng: random.Random) -> str:
    """A fixed program: a random allowed take."""
    pile = pile_of(observation)
    most = int(re.search(r"take 1-(\d+)", observation).group(1))
    return str(rng.randint(1, min(most, pile)))


def take_one(observation: str, rng: random.Random) -> str:
    """A fixed program: always take one stone."""
    return "1"


class NimEnv(TextEnv):
    reusable = True  # reset draws the pile and sets the mover

    def __init__(self, low: int = 5, high: int = 12, max_take: int = 3, invalid: str = "lose"):
        super().__init__()
        if invalid not in ("lose", "take_one"):
            raise ValueError(f"nim's invalid is 'lose' or 'take_one', got {invalid!r}")
        self.invalid = invalid
        if not 1 <= low <= high:
            raise ValueError(f"nim needs 1 <= low <= high, got low={low} high={high}")
        if max_take < 1:
            raise ValueError(f"nim needs max_take >= 1, got {max_take}")
        self.low, self.high, self.max_take = low, high, max_take
        self.pile = 0
        self.mover = 0
        self.over = True

    def _ask(self, prefix: str) -> str:
        # the stones left come last, right before the answer: a tiny model finds them there (as guess_number's range)
        return f"{prefix}take 1-{min(self.max_take, self.pile)}, {self.pile} left"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pile = int(self.np_random.integers(self.low, self.high + 1))
        self.mover, self.over = 0, False
        return self._ask(""), {"player": PLAYERS[0], "state_key": (self.pile, 0)}

    def step(self, action):
        if self.over:
            raise RuntimeError("step() after the game ended; call reset() to start a new one")
        mover, other = PLAYERS[self.mover], PLAYERS[1 - self.mover]
        take = parse_take(action)
        if take is None or not 1 <= take <= min(self.max_take, self.pile):
            if self.invalid == "lose":
                return self._end(other, mover, "invalid move")
            take = 1
        self.pile -= take
        if self.pile == 0:
            return self._end(mover, other, "took the last")
        self.mover = 1 - self.mover
        info = {"player": other, "state_key": (self.pile, self.mover)}
        return self._ask(f"other took {take}, "), 0.0, False, False, info

    def _end(self, winner: str, loser: str, why: str):
        self.over = True
        info = {"player": None, "winner": winner, "rewards": {winner: 1.0, loser: -1.0}, "metrics": {"moves": 1}}
        mover_won = winner == PLAYERS[self.mover]
        return f"{why}, game over", 1.0 if mover_won else -1.0, True, False, info
