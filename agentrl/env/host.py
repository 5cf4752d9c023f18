"""Hosts many environment instances, one per episode, and runs their requests.

Env code is user code: an exception ends that episode with a recorded error instead of
taking the rank down. Results are plain tuples so they pickle small.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.env.registry import make


@dataclass
class EnvResult:
    ok: bool
    value: tuple | None = None  # reset: (obs, info); step: (obs, reward, terminated, truncated, info)
    error: str | None = None


@dataclass
class EnvHost:
    env_id: str
    env_kwargs: dict = field(default_factory=dict)
    factory: Callable | None = None
    envs: dict = field(default_factory=dict)
    failures: int = 0

    def handle(self, op: str, key, *args) -> EnvResult:
        try:
            if op == "reset":
                seed, options = args
                env = self.envs.get(key)
                if env is None:
                    env = self.envs[key] = (self.factory or make)(self.env_id, **self.env_kwargs)
                obs, info = env.reset(seed=seed, options=options)
                return EnvResult(True, (_check_text(obs, "reset"), info))
            if op == "step":
                (action,) = args
                obs, reward, terminated, truncated, info = self.envs[key].step(action)
                return EnvResult(
                    True, (_check_text(obs, "step"), float(reward), bool(terminated), bool(truncated), info)
                )
            if op == "close":
                env = self.envs.pop(key, None)
                if env is not None:
                    env.close()
                return EnvResult(True)
            raise ValueError(f"unknown env op {op!r}")
        except Exception as error:  # env code is user code: contain it, count it, report it
            self.failures += 1
            self.envs.pop(key, None)
            detail = "".join(traceback.format_exception_only(type(error), error)).strip()
            return EnvResult(False, error=f"{self.env_id} {op} failed: {detail}\n{traceback.format_exc(limit=-3)}")


def _check_text(obs, where: str) -> str:
    if not isinstance(obs, str):
        raise TypeError(f"env {where}() must return a str observation, got {type(obs).__name__}")
    return obs
