"""A ragged workload for benchmarks/bench_dispatch.py: guess_number where a quarter of the tasks are slow.

`RaggedGuessEnv` is guess_number (1..7, 3 guesses) whose every step on a slow task (seed % slow_every == 0)
burns `slow_step_s` of CPU in Python, as a tool call that runs code would: with envs in-process it holds
the rollout rank that drew the task. Which rank draws how many slow tasks varies from step to step.
"""

from __future__ import annotations

import time

from envs.guess_number.env import GuessNumberEnv


class RaggedGuessEnv(GuessNumberEnv):
    def __init__(self, slow_every: int = 4, slow_step_s: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.slow_every, self.slow_step_s, self.slow = slow_every, slow_step_s, False

    def reset(self, *, seed=None, options=None):
        self.slow = seed is not None and seed % self.slow_every == 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.slow:
            deadline = time.thread_time() + self.slow_step_s
            while time.thread_time() < deadline:  # CPU, not a sleep: it holds the GIL as real work would
                pass
        return super().step(action)
