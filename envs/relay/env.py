"""Relay: a cooperative game of two players, "proposer" and "solver" (info["player"] names whose turn it is).
The proposer sees a secret number from 1 to `numbers` and writes a hint; the solver sees only the hint and names the
number. Both earn 1 when the solver is right, so the two policies must agree on a code that neither is given.

`answer_reward` pays the solver for answering with a number in range at all (its share of the signal before the
two agree on anything); the proposer's reward is the team's success alone.
"""

from __future__ import annotations

import re

from agentrl.env.api import TextEnv

NUMBER = re.compile(r"\d+")


class RelayEnv(TextEnv):
    def __init__(self, numbers: int = 3, answer_reward: float = 0.1):
        super().__init__()
        if numbers < 2:
            raise ValueError(f"relay needs numbers >= 2, got {numbers}")
        self.numbers, self.answer_reward = numbers, answer_reward
        self.secret = 0
        self.turn = "done"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(1, self.numbers + 1))
        self.turn = "proposer"
        # what a player acts on comes last, right before its answer, where a tiny model finds it
        return f"hint at the secret, {self.secret}", {"player": "proposer", "state_key": self.secret}

    def step(self, action):
        if self.turn == "proposer":
            self.turn = "solver"
            hint = action.strip()[:16] or "none"
            return f"name 1-{self.numbers}, hint {hint}", 0.0, False, False, {"player": "solver"}
        if self.turn != "solver":
            raise RuntimeError("step() after the game ended; call reset() to start a new one")
        self.turn = "done"
        match = NUMBER.search(action)
        guess = int(match.group()) if match else None
        solved = guess == self.secret
        answered = guess is not None and 1 <= guess <= self.numbers
        rewards = {"proposer": float(solved), "solver": float(solved) + self.answer_reward * answered}
        info = {"player": None, "success": solved, "rewards": rewards}
        return ("right" if solved else "wrong"), rewards["solver"], True, False, info
