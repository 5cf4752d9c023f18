"""Relay: a cooperative game of two players, "proposer" and "solver" (info["player"] names whose turn it is).
The proposer is given a target from 2 to `numbers + 1` and poses a problem, a number x; the solver sees only the
problem ("add one to x") and answers. The solver earns 1 for solving the problem as posed (x + 1); the proposer
earns 1 when the solver's answer is the target, which takes a problem posed right (x = target - 1) and solved.
So each policy has its own reward and its own skill, and the proposer's reward rises only with the solver's.
A proposal that holds no number from 1 to `numbers` is replaced by a random problem (and earns the proposer
nothing), so the solver has a problem to learn from while the proposer still writes nonsense.
"""

from __future__ import annotations

from agentrl.env.api import TextEnv
from envs.relay.rules import outcome, posed_problem


class RelayEnv(TextEnv):
    def __init__(self, numbers: int = 3):
        super().__init__()
        if numbers < 2:
            raise ValueError(f"relay needs numbers >= 2, got {numbers}")
        self.numbers = numbers
        self.target = 0
        self.problem = 0
        self.posed = False
        self.turn = "done"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(2, self.numbers + 2))
        self.turn = "proposer"
        # what a player acts on comes last, right before its answer, where a tiny model finds it
        return f"pose a problem for {self.target}", {"player": "proposer", "state_key": self.target}

    def step(self, action):
        if self.turn == "proposer":
            self.turn = "solver"
            posed = posed_problem(action, self.numbers)
            self.posed = posed is not None
            self.problem = posed if self.posed else int(self.np_random.integers(1, self.numbers + 1))
            info = {"player": "solver", "state_key": self.problem}
            return f"add one to {self.problem}", 0.0, False, False, info
        if self.turn != "solver":
            raise RuntimeError("step() after the game ended; call reset() to start a new one")
        self.turn = "done"
        rewards, successes = outcome(self.target, self.problem, self.posed, action)
        reached = successes["proposer"]
        info = {"player": None, "success": reached, "rewards": rewards, "successes": successes}
        return ("right" if reached else "wrong"), rewards["solver"], True, False, info
