"""The scorer role (layout.scorer): load the scoring model once (reward.model, or a judge's reward.judge.path) and
score the finished episodes of the rollout ranks it serves, batched across them, until each says goodbye.

Wire format: a rollout rank sends `(request_id, [episode fields, ...])` (agentrl/scoring/remote.py) and gets back
`(request_id, [(reward, success, cached) or the reason it has no score, ...])`; its goodbye is None, answered with
None once every request of its is answered (the last word: nothing follows it). Requests are answered as their
scores come, not in order: the episodes of all rollout ranks meet in one ScoreBatcher, so one forward (or one
judge generation) scores several ranks' episodes, and the cache serves identical transcripts of any rank.
Scoring failures (a text too long, a forward past its timeout, a judge reply without a score) are answered as
failures, and fail their episodes; a bug here stops the job (transport.abort_on_exception).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from agentrl import transport
from agentrl.config import Config
from agentrl.layout import Layout
from agentrl.run import preempt, startup_gc
from agentrl.scoring.batcher import ScoreBatcher
from agentrl.scoring.score import ScoreFailed
from agentrl.scoring.scorer import ModelScorer
from agentrl.transport import Tag


def run_scorer(config: Config, layout: Layout) -> None:
    scorer = ModelScorer(config.reward, layout.device)
    startup_gc.settle()
    clients = layout.rollout_ranks_scored_by(layout.rank)
    leader = layout.trainer_ranks[0]
    server = ScoreServer(layout.world, scorer, clients, after_request=lambda: preempt.forward(layout.world, leader))
    asyncio.run(server.run())
    print(f"agentrl: scorer rank {layout.rank}, {scorer.path}: {server.counts.summary(scorer.batcher)}", flush=True)


@dataclass
class ServerCounts:
    """What a scorer rank did: requests and episodes taken, and its batches that held episodes of several rollout
    ranks (the batcher counts the rest: agentrl/scoring/batcher.py)."""

    requests: int = 0
    episodes: int = 0
    shared_batches: int = 0

    def summary(self, batcher: ScoreBatcher) -> str:
        counts = batcher.counts
        scored = counts.asked - counts.cached
        per_batch = scored / counts.batches if counts.batches else 0.0
        return (
            f"{self.episodes} episodes in {self.requests} requests, {counts.cached} answered from the cache or a same "
            "text in flight; "
            f"{counts.batches} scoring batches (forwards or judge generations) of {per_batch:.1f} episodes on average, "
            f"{self.shared_batches} of them with episodes of 2 or more rollout ranks; {counts.failed} failed"
        )


class ScoreServer:
    """Answers the score requests of `clients` (rollout ranks) until each has said goodbye."""

    def __init__(self, comm, scorer: ModelScorer, clients: list[int], after_request: Callable[[], None] | None = None):
        self.comm, self.scorer, self.after_request = comm, scorer, after_request
        self.open_clients = set(clients)
        self.answering: dict[int, set[asyncio.Task]] = defaultdict(set)
        self.asking: dict[str, set[int]] = defaultdict(set)  # a text waiting for its score -> the ranks asking
        self.counts = ServerCounts()
        batch = scorer.batcher.score_batch
        scorer.batcher.score_batch = lambda texts: self._counted(batch, texts)

    async def run(self) -> None:
        from mpi4py import MPI

        farewells: set[asyncio.Task] = set()
        backoff = transport.Backoff(polling=transport.SCORE_POLLING)
        while self.open_clients:
            found, message, client = transport.try_recv(self.comm, MPI.ANY_SOURCE, Tag.SCORE_REQUEST)
            if not found:
                await asyncio.sleep(backoff.next_delay())
                continue
            backoff = transport.Backoff(polling=transport.SCORE_POLLING)
            if message is None:
                self.open_clients.discard(client)
                farewells.add(asyncio.ensure_future(self._farewell(client)))
                continue
            request_id, episodes = message
            self.counts.requests += 1
            self.counts.episodes += len(episodes)
            task = asyncio.ensure_future(self._answer(client, request_id, episodes))
            self.answering[client].add(task)
            task.add_done_callback(self.answering[client].discard)
            if self.after_request is not None:
                self.after_request()
        await asyncio.gather(*farewells)

    async def _answer(self, client: int, request_id: int, episodes: list[dict]) -> None:
        results = await asyncio.gather(*(self._score(client, arguments) for arguments in episodes))
        transport.send(self.comm, (request_id, results), client, Tag.SCORE_REPLY)

    async def _score(self, client: int, arguments: dict) -> tuple[float, bool | None, bool] | str:
        try:
            text = self.scorer.text(arguments)
        except Exception as error:  # a chat template that refuses this conversation: this episode's failure
            return f"writing the episode as the scorer's text raised {error!r}"
        self.asking[text].add(client)
        try:
            score = await self.scorer.score_text(text)
        except ScoreFailed as failure:
            return str(failure)
        finally:
            self.asking.pop(text, None)
        return score.reward, score.success, bool(score.metrics["score_cached"])

    async def _farewell(self, client: int) -> None:
        """The last word to a rollout rank that said goodbye, once every reply to it is sent."""
        await asyncio.gather(*self.answering.pop(client, ()))
        transport.send(self.comm, None, client, Tag.SCORE_REPLY)

    async def _counted(self, score_batch, texts: list[str]) -> list:
        if len(set().union(*(self.asking.get(text, ()) for text in texts))) > 1:
            self.counts.shared_batches += 1
        return await score_batch(texts)
