"""Two simulated trainer ranks in one process: threads whose `reduce` sums their arrays at a barrier."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np


def run_two_ranks(job: Callable[[int, Callable[[np.ndarray], np.ndarray]], object]) -> list:
    """Run job(rank, reduce) for ranks 0 and 1 at once; reduce adds both ranks' arrays (like an all-reduce)."""
    barrier = threading.Barrier(2, timeout=10)
    slots: list = [None, None]
    results: list = [None, None]
    errors: list = []

    def reduce_for(rank: int):
        def reduce(values: np.ndarray) -> np.ndarray:
            slots[rank] = np.array(values, dtype=np.float64, copy=True)
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()  # both read before either writes its next array
            return total

        return reduce

    def run(rank: int) -> None:
        try:
            results[rank] = job(rank, reduce_for(rank))
        except Exception as error:  # raised again below, in the test's thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    if errors:
        raise errors[0]
    return results
