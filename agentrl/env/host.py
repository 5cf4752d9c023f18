"""Hosts many environment instances, one per episode, and runs their requests.

Env code is user code: an exception ends that episode with a recorded error instead of
taking the rank down. With `call_timeout_s`, each call runs in a daemon worker thread and
a call that outlives the timeout ends its episode too: the instance is abandoned (a
Python thread cannot be killed, so a hung in-process call keeps its thread until the
process ends; an instance with a `kill()` method, like `SubprocessEnv`, is killed).
The calls of one batch run side by side and share one deadline, so a batch never takes
much longer than the timeout. Results are plain tuples so they pickle small.

Counts reconcile: `started` = `finished` + `failures` + `len(envs)` (episodes still open).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.config import RuntimeConfig
from agentrl.env.registry import make

# train.py passes runtime.env_step_timeout_s; hosts built without it still get its default
DEFAULT_CALL_TIMEOUT_S = RuntimeConfig.model_fields["env_step_timeout_s"].default


@dataclass
class EnvResult:
    ok: bool
    value: tuple | None = None  # reset: (obs, info, tools); step: (obs, reward, terminated, truncated, info)
    error: str | None = None


class DaemonWorkers:
    """Daemon threads reused across calls. A thread stuck in a hung call never comes back,
    so a new thread starts whenever no idle one is left; being daemons, stuck threads do
    not keep the process from exiting."""

    def __init__(self):
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, task: Callable[[], None]) -> None:
        with self.lock:
            if self.idle:
                self.idle -= 1
            else:
                threading.Thread(target=self._serve, daemon=True).start()
        self.tasks.put(task)

    def _serve(self) -> None:
        while True:
            self.tasks.get()()
            with self.lock:
                self.idle += 1


@dataclass
class EnvHost:
    env_id: str
    env_kwargs: dict = field(default_factory=dict)
    factory: Callable | None = None
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S  # None: env code runs inline, without a time limit
    chat_format: str | None = None  # the run's chat format family; envs that parse turns (ToolEnv) are told it
    envs: dict = field(default_factory=dict)
    started: int = 0  # episodes whose env was created by a reset
    finished: int = 0  # episodes closed normally
    failures: int = 0  # calls that raised or timed out; each ends its episode
    _workers: DaemonWorkers = field(default_factory=DaemonWorkers, repr=False)

    def handle(self, op: str, key, *args) -> EnvResult:
        return self.handle_batch([(op, key, *args)])[0]

    def handle_batch(self, requests: list[tuple]) -> list[EnvResult]:
        """Results for `(op, key, *args)` requests, in order; each call is bounded by `call_timeout_s`."""
        if self.call_timeout_s is None:
            outcomes = [self._run(op, self.envs.get(key), args) for op, key, *args in requests]
        else:
            outcomes = self._run_in_threads(requests)
        return [self._record(op, key, outcome) for (op, key, *_), outcome in zip(requests, outcomes, strict=True)]

    def _run_in_threads(self, requests: list[tuple]) -> list[tuple]:
        outcomes: list[tuple | None] = [None] * len(requests)
        done = threading.Semaphore(0)

        def work(index: int, op: str, env, args: tuple) -> None:
            outcomes[index] = self._run(op, env, args)
            done.release()

        for index, (op, key, *args) in enumerate(requests):
            self._workers.submit(functools.partial(work, index, op, self.envs.get(key), tuple(args)))
        deadline = time.monotonic() + self.call_timeout_s
        for _ in requests:
            if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        finished = list(outcomes)  # a late thread may still write to `outcomes`; decide once
        for (_, key, *_), outcome in zip(requests, finished, strict=True):
            abandoned = self.envs.get(key) if outcome is None else None
            if hasattr(abandoned, "kill"):  # e.g. a SubprocessEnv: end its process, which frees the thread
                abandoned.kill()
        timed_out = (
            f"{self.env_id} {{}} timed out after {self.call_timeout_s:g}s (runtime.env_step_timeout_s); "
            "the env instance was abandoned. Make reset/step faster or raise the timeout"
        )
        return [
            outcome if outcome is not None else (None, EnvResult(False, error=timed_out.format(op)))
            for outcome, (op, *_) in zip(finished, requests, strict=True)
        ]

    def _run(self, op: str, env, args: tuple) -> tuple:
        """(env instance, result): touches only `env`, so it may run in a worker thread."""
        try:
            if op == "reset":
                seed, options = args
                if env is None:
                    env = (self.factory or make)(self.env_id, **self.env_kwargs)
                    if self.chat_format is not None and hasattr(env, "use_chat_format"):
                        env.use_chat_format(self.chat_format)
                obs, info = env.reset(seed=seed, options=options)
                tools = list(getattr(env, "tools", None) or [])
                return env, EnvResult(True, (_check_text(obs, "reset"), info, tools))
            if op == "close":
                if env is not None:
                    env.close()
                return env, EnvResult(True)
            if env is None:
                raise KeyError(f"no open env for this episode: {op}() came before reset() or after a failure")
            if op == "step":
                (action,) = args
                obs, reward, terminated, truncated, info = env.step(action)
                return env, EnvResult(True, (_check_text(obs, "step"), reward, bool(terminated), bool(truncated), info))
            raise ValueError(f"unknown env op {op!r}")
        except Exception as error:  # env code is user code: contain it, count it, report it
            detail = "".join(traceback.format_exception_only(type(error), error)).strip()
            return env, EnvResult(False, error=f"{self.env_id} {op} failed: {detail}\n{traceback.format_exc(limit=-3)}")

    def _record(self, op: str, key, outcome: tuple) -> EnvResult:
        env, result = outcome
        new_episode = op == "reset" and key not in self.envs
        self.started += new_episode
        if not result.ok:
            self.failures += 1
            dropped = self.envs.pop(key, None)
            if hasattr(dropped, "kill"):  # a SubprocessEnv whose call failed: do not leave its process behind
                dropped.kill()
        elif new_episode:
            self.envs[key] = env
        elif op == "close" and self.envs.pop(key, None) is not None:
            self.finished += 1
        return result

    def counts(self) -> dict[str, int]:
        return {"started": self.started, "finished": self.finished, "failed": self.failures, "open": len(self.envs)}


def _check_text(obs, where: str) -> str:
    if not isinstance(obs, str):
        raise TypeError(f"env {where}() must return a str observation, got {type(obs).__name__}")
    return obs
