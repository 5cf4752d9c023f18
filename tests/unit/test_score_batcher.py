"""The score batcher on its own: batches by size and by wait, the cache (least recently used out first), one call
for a text in flight twice, failures reaching only their texts and never cached."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.scoring.batcher import ScoreBatcher
from agentrl.scoring.score import ScoreFailed


class Recorder:
    """A score_batch that records its batches: each text's score is its length; texts starting with "bad" fail."""

    def __init__(self, delay_s: float = 0.0):
        self.batches: list[list[str]] = []
        self.delay_s = delay_s

    async def __call__(self, texts: list[str]) -> list:
        self.batches.append(list(texts))
        await asyncio.sleep(self.delay_s)
        return [ScoreFailed(f"cannot score {t}") if t.startswith("bad") else float(len(t)) for t in texts]


async def ask(batcher: ScoreBatcher, texts: list[str]) -> list:
    return await asyncio.gather(*(batcher.score(text) for text in texts), return_exceptions=True)


def test_full_batches_go_at_once_and_the_rest_after_the_wait():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder, batch_size=2, wait_s=0.3, cache_size=100)
    started = time.perf_counter()
    results = asyncio.run(ask(batcher, ["a", "bb", "ccc", "dddd", "eeeee"]))
    assert recorder.batches == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]
    assert 0.3 <= time.perf_counter() - started < 2.0  # the odd one waited wait_s for company
    assert [score for score, _ in results] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert batcher.counts.batches == 3 and batcher.counts.asked == 5


def test_a_text_in_flight_twice_is_scored_once_and_then_comes_from_the_cache():
    recorder = Recorder(delay_s=0.05)
    batcher = ScoreBatcher(recorder, batch_size=8, wait_s=0.01, cache_size=100)
    results = asyncio.run(ask(batcher, ["same", "same", "other"]))
    assert recorder.batches == [["same", "other"]]
    assert results == [(4.0, False), (4.0, True), (5.0, False)]
    assert asyncio.run(ask(batcher, ["same"])) == [(4.0, True)] and len(recorder.batches) == 1


def test_failures_reach_only_their_texts_and_are_asked_again():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder, batch_size=8, wait_s=0.01, cache_size=100)
    good, bad = asyncio.run(ask(batcher, ["good", "bad one"]))
    assert good == (4.0, False)
    assert isinstance(bad, ScoreFailed) and str(bad) == "cannot score bad one"
    again = asyncio.run(ask(batcher, ["bad one"]))
    assert isinstance(again[0], ScoreFailed) and recorder.batches[-1] == ["bad one"]
    assert batcher.counts.failed == 2 and "bad one" not in batcher.cache


def test_the_cache_keeps_the_most_recently_used():
    recorder = Recorder()
    batcher = ScoreBatcher(recorder, batch_size=1, wait_s=0, cache_size=2)

    async def in_turn(texts):
        return [await batcher.score(text) for text in texts]

    asyncio.run(in_turn(["a", "bb", "a", "ccc"]))  # "a" used again, so "bb" is the one to go
    assert list(batcher.cache) == ["a", "ccc"]
    assert recorder.batches == [["a"], ["bb"], ["ccc"]]


@pytest.mark.parametrize("answer", [[], "raise"])
def test_a_scorer_that_breaks_its_contract_fails_the_batch_with_the_reason(answer):
    async def broken(texts):
        if answer == "raise":
            raise RuntimeError("bug in the scorer")
        return answer

    batcher = ScoreBatcher(broken, batch_size=2, wait_s=0, cache_size=10)
    results = asyncio.run(ask(batcher, ["a", "b"]))
    assert all(isinstance(result, ScoreFailed) for result in results)
    reason = "bug in the scorer" if answer == "raise" else "returned 0 scores for a batch of 2 texts"
    assert reason in str(results[0])
