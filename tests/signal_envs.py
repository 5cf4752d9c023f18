"""Env plugins whose training signal is known in advance, for dynamic-sampling tests (`tests.signal_envs:...`)."""

from __future__ import annotations

import itertools
import zlib

from agentrl.env.api import TextEnv

EPISODES = itertools.count()


class SeedParityEnv(TextEnv):
    """Tasks with an even seed pay 0 to every answer (a group without signal, which DAPO drops); odd seeds pay
    per turn by the episode's place in this process's sequence of episodes (mod 7), plus a little by crc32 of the
    answer: a group's episodes differ whatever the model answers (a tiny model may give every member the same
    answer). `turns` steps."""

    def __init__(self, turns: int = 3):
        super().__init__()
        self.turns, self.seed, self.steps = turns, None, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed, self.steps = seed, 0
        self.episode = next(EPISODES)
        return "Guess the number between 1 and 10.", {}

    def step(self, action):
        if self.seed is None:
            raise RuntimeError("step() called before reset(): call reset() first")
        if self.steps >= self.turns:
            raise RuntimeError("step() after the episode ended: call reset() to start a new one")
        self.steps += 1
        reward = (self.episode % 7) / 7 + (zlib.crc32(action.encode()) % 7) / 49 if self.seed % 2 else 0.0
        done = self.steps >= self.turns
        return "higher", reward, done, False, {"success": reward > 0.5}
