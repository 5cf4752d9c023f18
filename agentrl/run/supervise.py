"""`agentrl supervise`: relaunch a crashed job with resume=true, as torchrun's `--max-restarts` does.

The supervised command is a whole launch (`mpirun -n 4 agentrl train CONFIG ...`, or the
same with srun): when it fails (a rank killed, out of memory, a lost node) it is started
again, up to N times, after a backoff that doubles from `--backoff-s`, with `resume=true`
appended, so it continues from its last checkpoint. Each restart prints one line and sets
AGENTRL_RESTART_COUNT for the new job (the trainer leader logs it as `run/restarts`), and
AGENTRL_SUPERVISOR to this supervisor's identity (host, pid, start time): a run lock left
by an earlier start, whichever node its rank 0 ran on, is then known to be stale.

Not restarted: success (0), a graceful stop by a signal (75), a user error (2), Ctrl-C
(130), and anything after this process itself got a stop signal, which it passes on to
the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agentrl.errors import EXIT_USER_ERROR, UserError
from agentrl.run.lock import RESTART_COUNT_VARIABLE, SUPERVISOR_VARIABLE, owner_record
from agentrl.run.preempt import EXIT_STOPPED
from agentrl.transport import EXIT_INTERRUPTED

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
FINAL_EXITS = {
    0: "finished",
    EXIT_STOPPED: "stopped by a signal, with a checkpoint",
    EXIT_USER_ERROR: "refused by a user error",
    EXIT_INTERRUPTED: "interrupted",
}
MAX_BACKOFF_S = 60.0


def restart_count() -> int:
    """How many times the supervisor has restarted this job (0 without one)."""
    text = os.environ.get(RESTART_COUNT_VARIABLE, "0")
    if not text.isdigit():
        raise UserError(f"{RESTART_COUNT_VARIABLE}={text!r} must be a count (0, 1, ...); unset it")
    return int(text)


def exit_status(returncode: int) -> int:
    """A shell's view of a child's end: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(status: int) -> str:
    if status in FINAL_EXITS:
        return f"exited {status} ({FINAL_EXITS[status]})"
    try:
        killed_by = signal.Signals(status - 128).name if status > 128 else None
    except ValueError:  # not a signal number
        killed_by = None
    return f"exited {status}" + (f" (killed by {killed_by})" if killed_by else "")


def backoff_s(restart: int, base_s: float) -> float:
    """Seconds to wait before restart number `restart` (1, 2, ...): base, 2 x base, 4 x base, ... at most a minute."""
    return min(base_s * 2 ** (restart - 1), MAX_BACKOFF_S)


def with_resume(command: list[str]) -> list[str]:
    return [*command, "resume=true"]


class Supervisor:
    def __init__(self, command: list[str], max_restarts: int, backoff_base_s: float):
        self.command = command
        self.max_restarts = max_restarts
        self.backoff_base_s = backoff_base_s
        self.child: subprocess.Popen | None = None
        self.signalled: list[int] = []
        me = owner_record()
        self.identity = f"{me['host']}:{me['pid']}:{me['pid_start_ticks']}"

    def _forward(self, signum, frame) -> None:
        self.signalled.append(signum)
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self._forward)
        restarts = 0
        while True:
            status, took = self._launch(restarts)
            if self.signalled:
                return status  # a stop was asked for: do not start again
            if status in FINAL_EXITS:
                return status
            if restarts >= self.max_restarts:
                say(f"the job {describe_exit(status)} after {took:.0f} s; no restarts left ({self.max_restarts} used)")
                return status
            restarts += 1
            delay = backoff_s(restarts, self.backoff_base_s)
            say(
                f"restart {restarts}/{self.max_restarts}: the job {describe_exit(status)} after {took:.0f} s; "
                f"starting it again with resume=true in {delay:.1f} s"
            )
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and not self.signalled:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            if self.signalled:
                return status

    def _launch(self, restarts: int) -> tuple[int, float]:
        command = self.command if restarts == 0 else with_resume(self.command)
        env = {**os.environ, RESTART_COUNT_VARIABLE: str(restarts), SUPERVISOR_VARIABLE: self.identity}
        started = time.monotonic()
        # Its own session: a terminal's Ctrl-C reaches this process only, which passes it on once.
        self.child = subprocess.Popen(command, env=env, start_new_session=True)
        returncode = self.child.wait()
        return exit_status(returncode), time.monotonic() - started


def say(message: str) -> None:
    print(f"agentrl supervise: {message}", file=sys.stderr, flush=True)


def supervise(command: list[str], max_restarts: int, backoff_base_s: float) -> int:
    if not command:
        raise UserError("agentrl supervise needs a command after --, e.g. -- mpirun -n 4 agentrl train CONFIG")
    return Supervisor(command, max_restarts, backoff_base_s).run()
