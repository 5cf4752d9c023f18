"""Graceful stop on SIGUSR1 / SIGTERM / SIGINT: the handler only sets a flag; the trainer loop acts on it.

SLURM sends SIGUSR1 before the time limit (`--signal=USR1@120`) and SIGTERM before
killing or preempting a job; Ctrl-C sends SIGINT. At each step boundary the trainer ranks
agree (any one flagged stops them all), the leader checkpoints the completed steps and
tells the rollout ranks to stop through the weight-sync header; every rank then leaves
cleanly and the process exits with EXIT_STOPPED, so a job script can tell "stopped, resume
me" from "finished" (0) and "failed" (anything else).

A rollout or env rank that is signalled on its own (a `kill` of one process) passes the
request to the trainer leader with a STOP_REQUEST message; the leader counts it as its own.
A second SIGINT stops this process at once (KeyboardInterrupt), without a checkpoint.
"""

from __future__ import annotations

import signal
import sys

import numpy as np

from agentrl import transport
from agentrl.transport import Tag

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
# EX_TEMPFAIL from sysexits.h: a temporary failure, the same command should be retried (with resume=true).
EXIT_STOPPED = 75

_received: list[int] = []
_forwarded = False
_forward_in_flight = None  # the STOP_REQUEST send; it may complete only once the leader receives it
_requested_by: list[str] = []  # "SIGTERM on rank 1": who asked for the stop, for the leader's message


def _flag(signum, frame) -> None:
    if signum == signal.SIGINT and signal.SIGINT in _received:
        raise KeyboardInterrupt  # the second Ctrl-C: stop now
    first = not _received
    _received.append(signum)
    if first and signum == signal.SIGINT and transport.world_rank() == 0:
        sys.stderr.write(
            "\nagentrl: Ctrl-C: stopping at the end of this step with a checkpoint (Ctrl-C again: stop now, "
            "without one)\n"
        )
        sys.stderr.flush()


def install() -> None:
    """Catch the stop signals in this process from now on."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _flag)


def requested() -> bool:
    """Whether this process has received a stop signal, or a stop request from another rank."""
    return bool(_received) or bool(_requested_by)


def signal_name() -> str:
    return signal.Signals(_received[0]).name if _received else "a signal"


def forward(comm, leader: int) -> None:
    """Rollout and env ranks: once signalled, tell the trainer leader (once; cheap when not signalled).

    Never waits: the leader takes the request at its next step boundary, while this rank
    goes on sending its batch. `finish_forwarding()` completes the send before the job ends.
    """
    global _forwarded, _forward_in_flight
    if not _received or _forwarded:
        return
    _forwarded = True
    message = {"rank": comm.Get_rank(), "signal": signal_name()}
    _forward_in_flight = transport.isend(comm, message, leader, Tag.STOP_REQUEST)


def finish_forwarding() -> None:
    """Every rank, after the job's last barrier (the leader takes late requests after it): complete the send."""
    global _forward_in_flight
    if _forward_in_flight is not None:
        transport.wait_sent(_forward_in_flight, "the trainer leader to take this rank's stop request")
        _forward_in_flight = None


def take_forwarded(comm) -> list[str]:
    """Trainer leader: receive waiting stop requests from other ranks; they count as a signal to this rank."""
    from mpi4py import MPI

    taken = []
    while (found := transport.try_recv(comm, MPI.ANY_SOURCE, Tag.STOP_REQUEST))[0]:
        request = found[1]
        taken.append(f"{request['signal']} on rank {request['rank']}")
    _requested_by.extend(taken)
    return taken


def agreed(comm) -> bool:
    """Every rank of `comm` calls this at the same point; True on all of them if any was signalled."""
    return bool(transport.allreduce_sum(comm, np.array([int(requested())], dtype=np.int64))[0])


def reason() -> str:
    """What stopped this rank, for messages: "SIGTERM", or "SIGTERM on rank 2" when it came from another rank."""
    if _received:
        return signal_name()
    return ", ".join(_requested_by) or "a stop signal on another trainer rank"


def reset() -> None:
    """Forget received signals and requests (tests)."""
    global _forwarded, _forward_in_flight
    _received.clear()
    _requested_by.clear()
    _forwarded = False
    _forward_in_flight = None


def stopped_message(step: int) -> str:
    return f"agentrl: stopped by signal at step {step}, checkpoint written"
