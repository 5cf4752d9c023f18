"""Env plugins that misbehave on purpose, for fault-injection tests (`tests.fault_envs:FaultyEnv`)."""

from __future__ import annotations

import os
import time

from envs.guess_number.env import GuessNumberEnv


class FaultyEnv(GuessNumberEnv):
    """guess_number whose first step raises, hangs forever or kills its process when `seed % every == 0`."""

    def __init__(self, fault: str = "raise", every: int = 3, **kwargs):
        super().__init__(**kwargs)
        if fault not in ("raise", "hang", "exit"):
            raise ValueError(f"fault must be 'raise', 'hang' or 'exit', got {fault!r}")
        self.fault, self.every, self.seed = fault, every, None

    def reset(self, *, seed=None, options=None):
        self.seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.seed is not None and self.seed % self.every == 0 and self.guesses == 0:
            if self.fault == "raise":
                raise RuntimeError(f"injected fault for seed {self.seed}")
            if self.fault == "exit":
                os._exit(3)  # only ever run inside a SubprocessEnv
            while True:  # hang: only the host's timeout gets this episode back
                time.sleep(3600)
        return super().step(action)


def fails(seed: int, every: int) -> bool:
    return seed % every == 0


class BuildsOnRankZeroOnly(GuessNumberEnv):
    """guess_number that cannot be built on any MPI rank but 0: a package or file missing on some nodes."""

    def __init__(self, **kwargs):
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() != 0:
            raise FileNotFoundError(f"words.txt is missing on rank {MPI.COMM_WORLD.Get_rank()}")
        super().__init__(**kwargs)


class SlowOnRankEnv(GuessNumberEnv):
    """guess_number whose every step takes `delay_s` longer on MPI world rank `rank`: a rank beside a slow env
    (in-process envs, so the delay holds that rollout rank's event loop)."""

    def __init__(self, rank: int = 2, delay_s: float = 0.05, **kwargs):
        from mpi4py import MPI

        super().__init__(**kwargs)
        self.delay_s = delay_s if MPI.COMM_WORLD.Get_rank() == rank else 0.0

    def step(self, action):
        time.sleep(self.delay_s)
        return super().step(action)


class SessionCountingEnv(GuessNumberEnv):
    """guess_number that holds a session from each reset until close (or the next reset), as an openenv:http env
    holds one of its server's: `open_sessions` counts those of every instance."""

    open_sessions = 0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.holding = False

    def reset(self, *, seed=None, options=None):
        self.close()
        SessionCountingEnv.open_sessions += 1
        self.holding = True
        return super().reset(seed=seed, options=options)

    def close(self):
        if self.holding:
            SessionCountingEnv.open_sessions -= 1
            self.holding = False
        super().close()


class ReusableSessionEnv(SessionCountingEnv):
    """SessionCountingEnv that says its instances may be reused (its reset ends the last session and starts one)."""

    reusable = True
