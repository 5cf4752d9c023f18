"""A held-out split of generated problems: one in N, by a hash of the problem's text.

Seeds in `seeds` (first seed, count) draw only held-out problems, every other seed only the rest, so a training
run (seeds from 0) never sees a problem its evaluation (`eval.seeds`, from 1000000 by default) asks:

    split = HeldoutSplit(every=10)
    problem = split.draw(seed, lambda: generate(self.np_random), text_of=lambda p: p.text)
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TypeVar

DEFAULT_SEEDS = (1_000_000, 1_000_000)  # eval.seeds' default range

Problem = TypeVar("Problem")


class HeldoutSplit:
    def __init__(self, every: int = 0, seeds: tuple[int, int] | list[int] = DEFAULT_SEEDS):
        if every < 0 or every == 1:
            raise ValueError(f"heldout_every must be 0 (no held-out problems) or >= 2, got {every}")
        if len(seeds) != 2 or seeds[1] < 1:
            raise ValueError(f"heldout_seeds must be [first seed, count >= 1], got {list(seeds)}")
        self.every = every
        self.seeds = (int(seeds[0]), int(seeds[1]))

    def is_heldout_seed(self, seed: int | None) -> bool:
        first, count = self.seeds
        return seed is not None and first <= seed < first + count

    def is_heldout(self, text: str) -> bool:
        """True for the problems held out for evaluation (none when `every` is 0)."""
        return self.every > 0 and zlib.crc32(text.encode()) % self.every == 0

    def draw(self, seed: int | None, draw: Callable[[], Problem], text_of: Callable[[Problem], str]) -> Problem:
        """`draw()` until the problem is on the seed's side of the split (the first draw when there is no split)."""
        problem = draw()
        if self.every:
            heldout = self.is_heldout_seed(seed)
            while self.is_heldout(text_of(problem)) != heldout:
                problem = draw()
        return problem
