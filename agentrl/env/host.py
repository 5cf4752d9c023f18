"""Hosts many environment instances, one per open episode, and runs their requests.

Env code is user code: an exception ends that episode with a recorded error instead of
taking the rank down. With `call_timeout_s`, calls run in daemon worker threads and a
call that outlives the timeout ends its episode too: the instance is abandoned (a
Python thread cannot be killed, so a hung in-process call keeps its thread until the
process ends; an instance with a `kill()` method, like `SubprocessEnv`, is killed).
A batch's calls run one after another in one worker thread (one hand-over a batch, not
one a call); once a call has run `SPILL_AFTER_S`, each call not yet started gets a thread
of its own, so the calls of a batch share one deadline and a batch never takes much
longer than the timeout. Results are plain tuples so they pickle small.

Quick envs skip the hand-overs (`inline_quick_calls`): once a batch ended within
`SPILL_AFTER_S`, the next batch runs on the calling thread where that is the main thread of a
Linux process, under the same deadline, kept by a timer signal to that thread
(agentrl.env.main_thread_timer): at `SPILL_AFTER_S` its handler gives the calls not yet
started threads of their own, as above; at the deadline it raises CallDeadline inside the
running call, which ends that call's episode (the instance is dropped, or killed). A call
still running well past its deadline ends the job with its stack rather than hanging it. A
batch that ran past `SPILL_AFTER_S` sends the env back to worker threads until a batch is
quick again. (The signal interrupts a blocking system call of the running call; Python
retries it, but C code that does not may see EINTR.)

Instances are reused across episodes where the env class says it may be (`reusable =
True` in the class itself, agentrl.env.api.TextEnv) and `reuse` is on (env.reuse_instances):
an episode's close keeps its instance for a later episode's reset, as Gymnasium's vector
envs reset one instance episode after episode; every episode still starts with a reset
with its own seed. An instance whose call failed or timed out is never reused.
`close_idle` closes the kept ones.

Counts reconcile: `started` = `finished` + `failures` + `len(envs)` (episodes still open).
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.config import RuntimeConfig
from agentrl.env.main_thread_timer import CallDeadline, MainThreadTimer
from agentrl.env.registry import make

# train.py passes runtime.env_step_timeout_s; hosts built without it still get its default
DEFAULT_CALL_TIMEOUT_S = RuntimeConfig.model_fields["env_step_timeout_s"].default
# A call of a batch running this long (or half the timeout, if less) gives each call not yet started a thread.
SPILL_AFTER_S = 0.01
# After a batch's deadline, how often a call on the calling thread that swallowed CallDeadline is interrupted again
REFIRE_S = 1.0
# How long past its deadline a call on the calling thread may run before the job is ended: at least this, and at
# least the timeout again.
STUCK_GRACE_S = 30.0


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


class _Batch:
    """One batch's calls, run in order by one worker thread until `spill` gives each call not yet started a thread
    of its own; `ended` is set once every call has run (one wake-up for the waiting thread, not one a call)."""

    def __init__(self, calls: list[Callable[[], tuple]]):
        self.calls = calls
        self.outcomes: list[tuple | None] = [None] * len(calls)
        self.ended = threading.Event()
        self.lock = threading.Lock()
        self.next = 0  # the first call no thread has taken
        self.finished = 0

    def run_in_order(self) -> None:
        while True:
            with self.lock:
                if self.next >= len(self.calls):
                    return
                index, self.next = self.next, self.next + 1
            self._run_one(index)

    def _run_one(self, index: int) -> None:
        self.outcomes[index] = self.calls[index]()
        with self.lock:
            self.finished += 1
            if self.finished == len(self.calls):
                self.ended.set()

    def take_rest(self) -> range:
        """The calls no thread has taken, which none will take now."""
        with self.lock:
            rest, self.next = range(self.next, len(self.calls)), len(self.calls)
        return rest

    def spill(self, workers: DaemonWorkers) -> None:
        for index in self.take_rest():
            workers.submit(functools.partial(self._run_one, index))


class _HereBatch:
    """One batch's calls, run in order on the main thread under `MainThreadTimer`: its handler (`fire`, on this same
    thread, between two bytecodes of whatever runs) hands the calls not yet started to worker threads at the spill
    time and raises CallDeadline inside the running call at the deadline. Every call runs once, here or there."""

    def __init__(self, calls: list[Callable[[], tuple]], workers: DaemonWorkers, spill_at: float, deadline: float):
        self.calls, self.workers = calls, workers
        self.spill_at, self.deadline = spill_at, deadline
        self.outcomes: list[tuple | None] = [None] * len(calls)
        self.current: int | None = None  # the call running now; CallDeadline is raised only inside one
        self.spilled: _Batch | None = None  # the calls handed to worker threads, from `spilled_from` on
        self.spilled_from = len(calls)
        self.spill_due = self.past_spill = self.past_deadline = False
        self.raised_at = -REFIRE_S

    def run_in_order(self) -> None:
        for index, call in enumerate(self.calls):
            if self.past_deadline or self.spilled is not None:
                return
            if self.spill_due:
                self._spill(index)
                return
            try:
                self.current = index
                self.outcomes[index] = call()
            except CallDeadline:  # the outcome stays None: timed out
                pass
            finally:
                self.current = None

    def fire(self, timer: MainThreadTimer) -> None:
        now = time.monotonic()
        if not self.past_spill:
            if now < self.spill_at:  # a signal an earlier batch's timer sent just before it was disarmed
                return
            self.past_spill = True
            timer.arm(self.deadline - now, functools.partial(self.fire, timer), repeat_s=REFIRE_S)
            if self.current is None:
                self.spill_due = True  # between two calls: the loop hands the rest over before the next
            else:
                self._spill(self.current + 1)
            return
        if now < self.deadline:
            return
        self.past_deadline = True
        if self.current is not None and now - self.raised_at >= REFIRE_S / 2:
            self.raised_at = now
            raise CallDeadline

    def _spill(self, start: int) -> None:
        if start < len(self.calls):
            self.spilled_from, self.spilled = start, _Batch(self.calls[start:])
            self.spilled.spill(self.workers)

    def finished(self) -> list[tuple | None]:
        """Each call's outcome, None for those that did not end (decided once: a late thread may still write)."""
        if self.spilled is None:
            return list(self.outcomes)
        return self.outcomes[: self.spilled_from] + list(self.spilled.outcomes)


@dataclass
class EnvHost:
    env_id: str
    env_kwargs: dict = field(default_factory=dict)
    factory: Callable | None = None
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S  # None: env code runs inline, without a time limit
    chat_format: str | None = None  # the run's chat format family; envs that parse turns (ToolEnv) are told it
    reuse: bool = True  # env.reuse_instances: keep closed instances of classes that allow it for later episodes
    inline_quick_calls: bool = True  # runtime.env_quick_calls_inline: a quick env's calls on the main thread
    envs: dict = field(default_factory=dict)
    idle: list = field(default_factory=list)  # closed instances kept for later episodes (reused, not closed)
    started: int = 0  # episodes whose env was created (or taken from `idle`) by a reset
    finished: int = 0  # episodes closed normally
    failures: int = 0  # calls that raised or timed out; each ends its episode
    _workers: DaemonWorkers = field(default_factory=DaemonWorkers, repr=False)
    _quick: bool = False  # the last batch ended within SPILL_AFTER_S: the next may run on the calling thread

    def handle(self, op: str, key, *args) -> EnvResult:
        return self.handle_batch([(op, key, *args)])[0]

    def handle_batch(self, requests: list[tuple]) -> list[EnvResult]:
        """Results for `(op, key, *args)` requests, in order; each call is bounded by `call_timeout_s`."""
        given = self._instances_for(requests)
        outcomes: list[tuple | None] = [None] * len(requests)
        threaded = []  # the calls that run env code (a kept instance's close runs none: it is done here)
        for index, ((op, _, *args), env) in enumerate(zip(requests, given, strict=True)):
            if op == "close" and self._kept(env):
                outcomes[index] = (env, EnvResult(True))
            elif self.call_timeout_s is None:
                outcomes[index] = self._run(op, env, tuple(args))
            else:
                threaded.append(index)
        if threaded:
            calls = [functools.partial(self._run, requests[i][0], given[i], tuple(requests[i][2:])) for i in threaded]
            timer = MainThreadTimer.get() if self._quick and self.inline_quick_calls else None
            run = self._run_in_threads if timer is None else functools.partial(self._run_here, timer)
            ran = run([requests[i] for i in threaded], calls, [given[i] for i in threaded])
            for index, outcome in zip(threaded, ran, strict=True):
                outcomes[index] = outcome
        return [self._record(op, key, outcome) for (op, key, *_), outcome in zip(requests, outcomes, strict=True)]

    def _instances_for(self, requests: list[tuple]) -> list:
        """The instance each call runs on: the episode's own, a kept one for a new episode's reset, or None (a
        reset makes one)."""
        given, taken = [], {}
        for op, key, *_ in requests:
            env = self.envs.get(key, taken.get(key))
            if env is None and op == "reset" and self.idle:
                env = taken[key] = self.idle.pop()
            given.append(env)
        return given

    def _run_in_threads(self, requests: list[tuple], calls: list, given: list) -> list[tuple]:
        batch = _Batch(calls)
        self._workers.submit(batch.run_in_order)
        started = time.monotonic()
        spilled = self._wait(batch, started, spilled=False)
        finished = list(batch.outcomes)  # a late thread may still write to `outcomes`; decide once
        self._quick = not spilled and None not in finished
        return self._settled(requests, finished, given)

    def _run_here(self, timer: MainThreadTimer, requests: list[tuple], calls: list, given: list) -> list[tuple]:
        """The batch on this (the main) thread, its deadline kept by `timer` (the module's docstring)."""
        started = time.monotonic()
        here = _HereBatch(calls, self._workers, started + self._spill_after, started + self.call_timeout_s)
        timer.arm(self._spill_after, functools.partial(here.fire, timer))
        timer.guard(
            here.deadline + max(STUCK_GRACE_S, self.call_timeout_s),
            f"a call of {self.env_id} on this rank's main thread ran far past its deadline (runtime."
            "env_step_timeout_s) and did not stop when interrupted: it is blocked in C code, or catches "
            "BaseException. The job ends instead of hanging; runtime.env_quick_calls_inline=false runs env calls "
            "in worker threads, where such a call is abandoned. The call's stack:",
        )
        loop = asyncio._get_running_loop()  # env code sees no running loop, as in a worker thread (asyncio.run works)
        asyncio._set_running_loop(None)
        try:
            here.run_in_order()
        finally:
            timer.disarm()
            asyncio._set_running_loop(loop)
        if here.spilled is not None:
            self._wait(here.spilled, started, spilled=True)
        finished = here.finished()
        self._quick = not here.past_spill and None not in finished
        return self._settled(requests, finished, given)

    def _wait(self, batch: _Batch, started: float, spilled: bool) -> bool:
        """Wait for `batch` until its deadline, giving each call not yet started a thread of its own once the batch
        has run SPILL_AFTER_S (unless `spilled` already); whether it was spilled."""
        deadline = started + self.call_timeout_s
        while not batch.ended.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ended = batch.ended.wait(left if spilled else min(left, self._spill_after))
            # the batch as a whole, not one call: many quick calls in a row (an I/O-bound env) must not add up
            # to the deadline one after another
            if not ended and not spilled and time.monotonic() - started >= self._spill_after:
                batch.spill(self._workers)
                spilled = True
        batch.take_rest()  # past the deadline: calls not started never start
        return spilled

    @property
    def _spill_after(self) -> float:
        return min(SPILL_AFTER_S, self.call_timeout_s / 2)

    def _settled(self, requests: list[tuple], finished: list[tuple | None], given: list) -> list[tuple]:
        """Each call's outcome, a timeout for those that did not end (their instance killed where it can be)."""
        for env, outcome in zip(given, finished, strict=True):
            if outcome is None and hasattr(env, "kill"):  # e.g. a SubprocessEnv: end its process, freeing the thread
                env.kill()
        timed_out = (
            f"{self.env_id} {{}} timed out after {self.call_timeout_s:g}s (runtime.env_step_timeout_s); "
            "the env instance was abandoned. Make reset/step faster or raise the timeout"
        )
        return [
            outcome if outcome is not None else (None, EnvResult(False, error=timed_out.format(op)))
            for outcome, (op, *_) in zip(finished, requests, strict=True)
        ]

    def close_idle(self) -> None:
        """Close the instances kept for later episodes (at the end of a run)."""
        idle, self.idle = self.idle, []
        for env in idle:
            env.close()

    def _kept(self, env) -> bool:
        """Whether a closed episode's instance is kept for a later episode instead of closed."""
        return self.reuse and env is not None and reusable(env)

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
            dropped = self.envs.pop(key, env)  # the episode's instance, or the one its failed reset made or took
            if hasattr(dropped, "kill"):  # a SubprocessEnv whose call failed: do not leave its process behind
                dropped.kill()
        elif new_episode:
            self.envs[key] = env
        elif op == "close" and (closed := self.envs.pop(key, None)) is not None:
            self.finished += 1
            if self._kept(closed):
                self.idle.append(closed)
        return result

    def counts(self) -> dict[str, int]:
        return {"started": self.started, "finished": self.finished, "failed": self.failures, "open": len(self.envs)}


def reusable(env) -> bool:
    """Whether `env`'s class itself (not a base class: a subclass may add state its reset does not set) says its
    instances may play one episode after another (`reusable = True`)."""
    return type(env).__dict__.get("reusable") is True


def _check_text(obs, where: str) -> str:
    if not isinstance(obs, str):
        raise TypeError(f"env {where}() must return a str observation, got {type(obs).__name__}")
    return obs
