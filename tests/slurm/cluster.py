"""A throwaway single-node SLURM cluster for tests: munged, slurmctld and slurmd in a temp dir.

Everything lives under one folder (config, state, spool, logs, munge socket and key) and
uses free loopback ports, so it neither needs nor touches a system-wide SLURM or munge.
`SLURM_CONF` points the client commands (sbatch, scontrol, sinfo) at it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests import apt

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")


def install_packages() -> str | None:
    """apt-get install SLURM and munge when missing; returns why not, or None when they are there."""
    return apt.ensure(PACKAGES, lambda: all(Path(_tool(name)).exists() for name in DAEMONS))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
    """`start()` the daemons, `env` for client commands, `stop()` kills exactly the pids started here."""

    def __init__(self, root: Path, cpus: int):
        self.root = root
        self.cpus = cpus
        self.node = socket.gethostname()
        self.processes: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        root = self.root
        lines = [
            "ClusterName=agentrltest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            # cred_expire is also how long a requeued job is held before it may start again (default 120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",  # the node may claim more CPUs than it has (ranks oversubscribe)
            "KillWait=10",
            "SchedulerParameters=sched_interval=5",  # a requeued job starts soon after its hold ends
            "MinJobAge=600",
            # Job ids unlike any earlier test cluster's: MPICH names its shared-memory segments after the job, and a
            # job killed with SIGKILL leaves its segments behind for a later job of the same id to trip over.
            f"FirstJobId={random.randrange(1000, 1_000_000)}",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")  # noqa: SIM115 (lives as long as the daemon)
        self.processes.append(subprocess.Popen([_tool(name), *args], env=self.env, stdout=log, stderr=log))

    def start(self, timeout_s: float = 60) -> None:
        self.write_config()
        key = self.root / "munge" / "munge.key"
        subprocess.run([_tool("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        munge = self.root / "munge"
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        self._wait(lambda: self.munge_socket.exists(), timeout_s, "munged to open its socket")
        self._spawn("slurmctld", "-D", "-i")
        self._spawn("slurmd", "-D")
        self._wait(self._node_idle, timeout_s, f"node {self.node} to be idle in sinfo")

    def _node_idle(self) -> bool:
        result = self.run("sinfo", "--noheader", "--format=%t", check=False)
        return result.returncode == 0 and result.stdout.strip() == "idle"

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"gave up waiting for {what} (exited: {dead}); logs in {self.root / 'log'}")
            time.sleep(0.5)

    def run(self, *command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
