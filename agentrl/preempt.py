"""Graceful stop on SIGUSR1 / SIGTERM: the handler only sets a flag; the trainer loop acts on it.

SLURM sends SIGUSR1 before the time limit (`--signal=USR1@120`) and SIGTERM before
killing or preempting a job. At each step boundary the trainer ranks agree (any one
flagged stops them all), the leader checkpoints the completed steps and tells the rollout
ranks to stop through the weight-sync header; every rank then leaves cleanly and the
process exits with EXIT_STOPPED, so a job script can tell "stopped, resume me" from
"finished" (0) and "failed" (anything else).
"""

from __future__ import annotations

import signal

import numpy as np

from agentrl import transport

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
# EX_TEMPFAIL from sysexits.h: a temporary failure, the same command should be retried (with resume=true).
EXIT_STOPPED = 75

_received: list[int] = []


def _flag(signum, frame) -> None:
    _received.append(signum)


def install() -> None:
    """Catch the stop signals in this process from now on."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _flag)


def requested() -> bool:
    """Whether this process has received a stop signal."""
    return bool(_received)


def agreed(comm) -> bool:
    """Every rank of `comm` calls this at the same point; True on all of them if any was signalled."""
    return bool(transport.allreduce_sum(comm, np.array([int(requested())], dtype=np.int64))[0])


def reset() -> None:
    """Forget received signals (tests)."""
    _received.clear()


def stopped_message(step: int) -> str:
    return f"agentrl: stopped by signal at step {step}, checkpoint written; run again with resume=true to continue"
