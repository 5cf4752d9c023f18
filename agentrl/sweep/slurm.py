"""The SLURM backend: `sbatch --array=0-N%K slurm/sweep.sh SPEC`, where each array task claims the study's next
trial (a dead one to resume first) and runs it on the task's allocation."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from agentrl.run.preempt import EXIT_STOPPED
from agentrl.sweep.runner import TrialRun
from agentrl.sweep.study import Sweep

SCRIPT = "slurm/sweep.sh"
EXIT_FOR_STATE = {"complete": 0, "pruned": 0, "stopped": EXIT_STOPPED, "failed": 1}


def sbatch_command(spec_path: str | Path, sweep: Sweep, extra: list[str] = ()) -> list[str]:
    """One array task per trial of the budget, K at a time, each with the most ranks any of its bases needs."""
    spec = sweep.spec
    return [
        "sbatch",
        f"--array=0-{spec.budget() - 1}%{spec.concurrency}",
        f"--ntasks={spec.most_ranks()}",
        *extra,
        SCRIPT,
        str(spec_path),
    ]


def run_task(sweep: Sweep) -> int:
    """One array task: claim a trial, run it on the cores this task may use, stop it gracefully on USR1/TERM."""
    salt = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")) + 1000 * int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    study = sweep.study(sampler_salt=salt)
    claim = sweep.claim_next(study)
    if claim is None:
        print("agentrl sweep: no trial left to run (budget spent, or every trial runs elsewhere)", flush=True)
        return 0
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    run = TrialRun(sweep, study, claim, cores)
    verb = f"resumes (start {claim.attempt})" if claim.resume else "starts"
    job = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ.get("SLURM_JOB_ID", "none"))
    print(
        f"agentrl sweep: job {job}_{os.environ.get('SLURM_ARRAY_TASK_ID', '-')}: trial {claim.number} {verb}: "
        f"{claim.params} seed={claim.seed} in {sweep.trial_dir(claim.number)}",
        flush=True,
    )

    def request_stop(signum, frame):
        print(
            f"agentrl sweep: {signal.Signals(signum).name}: stopping trial {claim.number} with a checkpoint",
            file=sys.stderr,
            flush=True,
        )
        run.stop()

    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_stop)
    run.start()
    while (state := run.poll()) is None:
        time.sleep(1.0)
    print(f"agentrl sweep: trial {claim.number} {state}", flush=True)
    return EXIT_FOR_STATE[state]
