"""Uneven workloads for benchmarks/bench_dispatch.py: guess_number with slow env steps.

`RaggedGuessEnv` is guess_number (1..7, 3 guesses) whose every step on a slow task burns `slow_step_s` of
CPU in Python, as a tool call that runs code would: with envs in-process it holds the rollout rank that
runs it. Slow tasks are those with seed % slow_every == 0 (ragged: which rank draws how many of them
varies from step to step), or, with `slow_rank`, every task run on that MPI world rank (one slow rank:
a node with a slower env or CPU).
"""

from __future__ import annotations

import time

from envs.guess_number.env import GuessNumberEnv


class RaggedGuessEnv(GuessNumberEnv):
    def __init__(self, slow_every: int = 4, slow_step_s: float = 0.02, slow_rank: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.slow_every, self.slow_step_s, self.slow = slow_every, slow_step_s, False
        self.on_slow_rank = None
        if slow_rank is not None:
            from mpi4py import MPI

            self.on_slow_rank = MPI.COMM_WORLD.Get_rank() == slow_rank

    def reset(self, *, seed=None, options=None):
        if self.on_slow_rank is not None:
            self.slow = self.on_slow_rank
        else:
            self.slow = seed is not None and seed % self.slow_every == 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.slow:
            deadline = time.thread_time() + self.slow_step_s
            while time.thread_time() < deadline:  # CPU, not a sleep: it holds the GIL as real work would
                pass
        return super().step(action)
