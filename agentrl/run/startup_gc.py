"""A rank's start-up with fewer garbage-collector passes.

Importing torch and transformers and building a model create a few hundred thousand objects that live as long
as the process. At CPython's default thresholds the collector walks all of them again and again while they are
being created: a tenth to a fifth of a model rank's start-up CPU (benchmarks/bench_startup.py).

`defer_collection` raises the thresholds for the start-up; the `agentrl` command calls it first thing. `settle`
collects the youngest generation, sets everything older aside for good (`gc.freeze`) and restores the defaults.
A full collection there took 0.5 s for a few hundred objects of garbage; the youngest generation, 0.02 s.
The long-running loops settle before their first step (the train roles, `agentrl sft`, `agentrl serve`), the
light long-running commands at once (`supervise`, `sweep`). Short commands end deferred.
"""

from __future__ import annotations

import gc

STARTUP_THRESHOLDS = (100_000, 50, 100)
_defaults: tuple[int, int, int] | None = None


def defer_collection() -> None:
    global _defaults
    if _defaults is None:
        _defaults = gc.get_threshold()
        gc.set_threshold(*STARTUP_THRESHOLDS)


def settle() -> None:
    """End of start-up (idempotent): later collections walk only what the loop allocates."""
    global _defaults
    if _defaults is None:
        return
    gc.collect(0)
    gc.freeze()
    gc.set_threshold(*_defaults)
    _defaults = None
