"""Score requests gathered into batches, with a cache by exact text: one scoring call serves many episodes.

An episode asks `await batcher.score(text)`. A text scored before is answered from the cache; a text already
being scored waits for that same result; any other joins the pending batch, which is sent when it holds
`batch_size` texts or `wait_s` after its first arrived, whichever comes first. `score_batch(texts)` returns a
float or a ScoreFailed per text; a failure reaches only the episodes of its text and is never cached.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agentrl.scoring.score import ScoreFailed

ScoreBatch = Callable[[list[str]], Awaitable[list[float | ScoreFailed]]]


@dataclass
class BatcherCounts:
    """What a batcher did, over its life: texts asked for, answered from the cache (or from a call already in
    flight for the same text), batches sent and texts that failed."""

    asked: int = 0
    cached: int = 0
    batches: int = 0
    failed: int = 0


class ScoreBatcher:
    def __init__(self, score_batch: ScoreBatch, batch_size: int, wait_s: float, cache_size: int):
        self.score_batch, self.batch_size, self.wait_s, self.cache_size = score_batch, batch_size, wait_s, cache_size
        self.cache: OrderedDict[str, float] = OrderedDict()
        self.in_flight: dict[str, asyncio.Future] = {}
        self.pending: list[str] = []
        self.timer: asyncio.TimerHandle | None = None
        self.sending: set[asyncio.Task] = set()
        self.counts = BatcherCounts()

    async def score(self, text: str) -> tuple[float, bool]:
        """`text`'s score and whether it came without a call of its own (cached, or shared with one in flight);
        ScoreFailed with the reason when it has none."""
        self.counts.asked += 1
        if text in self.cache:
            self.cache.move_to_end(text)
            self.counts.cached += 1
            return self.cache[text], True
        if text in self.in_flight:
            self.counts.cached += 1
            return await asyncio.shield(self.in_flight[text]), True
        loop = asyncio.get_running_loop()
        self.in_flight[text] = loop.create_future()
        self.pending.append(text)
        if len(self.pending) >= self.batch_size:
            self._send()
        elif self.timer is None:
            self.timer = loop.call_later(self.wait_s, self._send)
        return await asyncio.shield(self.in_flight[text]), False

    def _send(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending = self.pending[: self.batch_size], self.pending[self.batch_size :]
        if self.pending:
            self.timer = asyncio.get_running_loop().call_later(self.wait_s, self._send)
        if batch:
            task = asyncio.ensure_future(self._score(batch))
            self.sending.add(task)  # a reference, so the task is not collected before it ends
            task.add_done_callback(self.sending.discard)

    async def _score(self, batch: list[str]) -> None:
        self.counts.batches += 1
        try:
            results = await self.score_batch(batch)
            if len(results) != len(batch):
                raise ScoreFailed(f"the scorer returned {len(results)} scores for a batch of {len(batch)} texts")
        except ScoreFailed as failure:
            results = [failure] * len(batch)
        except Exception as error:  # any bug: every waiting episode must hear it, not hang
            results = [ScoreFailed(f"scoring raised {error!r}")] * len(batch)
        for text, result in zip(batch, results, strict=True):
            future = self.in_flight.pop(text)
            if isinstance(result, ScoreFailed):
                self.counts.failed += 1
                future.set_exception(result)
                future.exception()  # marked as seen: an episode cancelled meanwhile leaves no "never retrieved" log
                continue
            if self.cache_size:
                self.cache[text] = result
                if len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
            future.set_result(result)
