"""The local backend: K trials at a time on this node, the cores split between them, until the budget is spent."""

from __future__ import annotations

import os
import signal
import sys
import time

from agentrl.run.preempt import EXIT_STOPPED
from agentrl.sweep.runner import TrialRun
from agentrl.sweep.status import progress_line
from agentrl.sweep.study import Sweep

POLL_S = 1.0


def core_slots(concurrency: int, cores: int | None) -> list[list[int] | None]:
    """The cores of each of the K trial slots: the usable cores split evenly (slots share cores when K > cores)."""
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    usable = usable[: cores or len(usable)]
    if concurrency >= len(usable):
        return [[usable[slot % len(usable)]] for slot in range(concurrency)]
    share = len(usable) // concurrency
    return [usable[slot * share : (slot + 1) * share] for slot in range(concurrency)]


def run_local(sweep: Sweep) -> int:
    """Run the sweep here; SIGINT/SIGTERM stop every running trial with a checkpoint (exit 75, `--resume` goes on)."""
    spec = sweep.spec
    study = sweep.study(sampler_salt=len(study_trials(sweep)))
    slots = core_slots(spec.concurrency, spec.cores)
    free = list(range(spec.concurrency))
    running: dict[int, TrialRun] = {}  # slot -> trial
    stop_requested: list[int] = []

    def request_stop(signum, frame):
        if not stop_requested:
            print(
                f"agentrl sweep: {signal.Signals(signum).name}: stopping the running trials with a checkpoint; "
                "continue later with --resume",
                file=sys.stderr,
                flush=True,
            )
        stop_requested.append(signum)
        for run in running.values():
            run.stop()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    shown = ""
    try:
        while True:
            for slot, run in list(running.items()):
                state = run.poll()
                if state is not None:
                    print(f"agentrl sweep: trial {run.claim.number} {state}", flush=True)
                    del running[slot]
                    free.append(slot)
            exhausted = False
            while free and not stop_requested:
                claim = sweep.claim_next(study)
                if claim is None:
                    exhausted = True
                    break
                slot = free.pop(0)
                run = TrialRun(sweep, study, claim, slots[slot])
                run.start()
                running[slot] = run
                verb = f"resumes (start {claim.attempt})" if claim.resume else "starts"
                print(
                    f"agentrl sweep: trial {claim.number} {verb}: {claim.params} seed={claim.seed} "
                    f"on cores {slots[slot]}",
                    flush=True,
                )
            line = progress_line(sweep, study)
            if line != shown:
                print(f"agentrl sweep: {line}", flush=True)
                shown = line
            if not running and (stop_requested or (exhausted and not sweep.waiting_to_resume(study))):
                break
            time.sleep(POLL_S)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return EXIT_STOPPED if stop_requested else 0


def study_trials(sweep: Sweep) -> list:
    if not (sweep.dir / "study.journal").exists():
        return []
    return sweep.study().get_trials(deepcopy=False)
