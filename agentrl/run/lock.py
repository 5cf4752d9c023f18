"""One run per run_dir: an exclusive `run_dir/.lock` holding who owns the folder.

Rank 0 takes it before touching the folder and gives it back on every way out (normal
end, exception, stop signal, interpreter exit). A `kill -9` or a lost node leaves it
behind; the next run takes it over when its owner is certainly gone: same host and that
process no longer runs (or the pid now belongs to a process started later), the same
SLURM job (a requeued or restarted job is never running twice), or an earlier start under
the same `agentrl supervise` (it starts a job only after the last one exited), whichever
node its rank 0 ran on. Otherwise the new run is
refused with the owner's host, pid, start time and command.

The lock is created complete and atomically with `os.link` of a written temp file, which
also works on NFS, where O_EXCL has not always been reliable.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from agentrl.errors import UserError

LOCK_FILE = ".lock"
# Set by `agentrl supervise` for the jobs it starts (agentrl.run.supervise names them; imported there).
SUPERVISOR_VARIABLE = "AGENTRL_SUPERVISOR"
RESTART_COUNT_VARIABLE = "AGENTRL_RESTART_COUNT"


class RunDirInUse(UserError):
    """Another run owns this run_dir."""


def _process_start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot; Linux /proc), to tell a reused pid from the original."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the command name may hold spaces


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:  # a killed rank its parent has not reaped yet is a zombie: gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (not Linux): kill(pid, 0) is all there is


def owner_record(command: list[str] | None = None) -> dict:
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start_ticks": _process_start_ticks(pid),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": shlex.join(command if command is not None else sys.argv),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "supervisor": os.environ.get(SUPERVISOR_VARIABLE),
        "restart": _restart_number(),
    }


def _restart_number() -> int | None:
    text = os.environ.get(RESTART_COUNT_VARIABLE, "")
    return int(text) if text.isdigit() else None


def why_stale(holder: dict) -> str | None:
    """Why the run recorded in `holder` is certainly gone, or None if it may still be running."""
    here = socket.gethostname()
    job = os.environ.get("SLURM_JOB_ID")
    same_host = holder.get("host") == here
    pid = holder.get("pid")
    if same_host and isinstance(pid, int):
        if not _alive(pid):
            return f"pid {pid} is no longer running"
        recorded, now = holder.get("pid_start_ticks"), _process_start_ticks(pid)
        if recorded is not None and now is not None and recorded != now:
            return f"pid {pid} now belongs to another process"
    if job and holder.get("slurm_job") == job and not same_host:
        return f"it was an earlier start of this SLURM job ({job}) on {holder.get('host')}"
    supervisor, restart, held = os.environ.get(SUPERVISOR_VARIABLE), _restart_number(), holder.get("restart")
    if supervisor and holder.get("supervisor") == supervisor and isinstance(held, int) and (restart or 0) > held:
        return (
            f"it was start {held} of this `agentrl supervise` ({supervisor}), on {holder.get('host')}; "
            f"this is start {restart}, begun after that one exited"
        )
    return None


def describe_holder(holder: dict) -> str:
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}"
        + (f", SLURM job {holder['slurm_job']}" if holder.get("slurm_job") else "")
        + f": {holder.get('command')}"
    )


class RunLock:
    """The lock of one run_dir, held by this process from `acquire()` to `release()`."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_FILE
        self.record: dict | None = None

    def acquire(self, command: list[str] | None = None, wait_s: float = 0.0) -> str | None:
        """Take the lock; a note when a stale one was taken over. Raises RunDirInUse if another run holds it.

        `wait_s`: how long a live holder may take to exit first (a restart, whose previous
        start the launcher is still tearing down).
        """
        record = owner_record(command)
        note = None
        deadline = time.monotonic() + wait_s
        attempts = 0
        while attempts < 3:  # a lock that disappears or goes stale between two looks: look again
            attempts += 1
            if self._create(record):
                self.record = record
                atexit.register(self.release)
                return note
            holder = self._read()
            if holder is None:
                continue  # released (or removed) just now
            if isinstance(holder, str):
                raise RunDirInUse(
                    f"{self.path} exists but is not a lock this version wrote ({holder}); "
                    f"if no agentrl run is using {self.path.parent}, delete {self.path} and start again"
                )
            stale = why_stale(holder)
            if stale is None and time.monotonic() < deadline:
                time.sleep(0.5)
                attempts -= 1
                continue
            if stale is None:
                raise RunDirInUse(
                    f"run_dir {self.path.parent} is in use by another agentrl run ({describe_holder(holder)}). "
                    f"Wait for it to end or stop it, or choose another run_dir=...; if that run is gone "
                    f"(e.g. its node was lost), delete {self.path}"
                )
            if self._take_over(holder):
                note = f"took over {self.path} from a run that is gone ({stale}; it started {holder.get('started')})"
        raise RunDirInUse(f"could not take {self.path}: other runs keep taking it; is a script starting runs in a loop")

    def release(self) -> None:
        """Give the lock back if this process still holds it (idempotent)."""
        if self.record is None:
            return
        if self._read() == self.record:
            self.path.unlink(missing_ok=True)
        self.record = None

    def _create(self, record: dict) -> bool:
        temp = self.path.with_name(f"{LOCK_FILE}.{record['host']}.{record['pid']}")
        temp.write_text(json.dumps(record))
        try:
            os.link(temp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            temp.unlink(missing_ok=True)

    def _read(self) -> dict | str | None:
        """The holder's record; None if there is no lock; a string saying why the file is not a lock."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
        except ValueError as error:
            return f"not JSON: {error}"
        return holder if isinstance(holder, dict) else "not a JSON object"

    def _take_over(self, stale: dict) -> bool:
        """Move the stale lock aside, unless another run replaced it in the meantime (then put it back)."""
        aside = self.path.with_name(f"{LOCK_FILE}.stale.{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            moved = json.loads(aside.read_text())
        except ValueError:
            moved = None
        if moved != stale:  # a live run's fresh lock: give it back, unless a third run holds the lock by now
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        aside.unlink(missing_ok=True)
        return True
