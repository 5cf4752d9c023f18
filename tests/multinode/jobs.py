"""MPI jobs across the test bed's nodes: hydra started on node0, proxies entering each node through `node_ssh`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import ROOT
from tests.multinode import cluster

QUICKSTART = str(ROOT / "launch" / "configs" / "quickstart.yaml")


def mpirun() -> str:
    found = shutil.which("mpirun", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("no mpirun next to this python: pip install mpich (bash launch/setup.sh)")
    return found


def hydra_argv(hosts: dict[str, int], argv: list[str]) -> list[str]:
    """`mpirun` of `argv` with hosts[name] ranks on each node in order (block placement); run it on node0."""
    spec = ",".join(f"{name}:{count}" for name, count in hosts.items())
    command = [mpirun(), "-launcher", "ssh", "-launcher-exec", str(cluster.NODE_SSH), "-hosts", spec]
    return [*command, "-n", str(sum(hosts.values())), *argv]


def mpirun_argv(hosts: dict[str, int], argv: list[str]) -> list[str]:
    """`hydra_argv` run on node0 (hydra resolves the nodes' names through the test bed's hosts file)."""
    return cluster.exec_argv(0, hydra_argv(hosts, argv), cwd=str(ROOT))


def supervised_train_argv(hosts: dict[str, int], overrides: list[str], max_restarts: int = 2) -> list[str]:
    """`agentrl supervise` on node0 around `mpirun ... agentrl train`: restarts after a crash with resume=true."""
    train = [sys.executable, "-m", "agentrl.cli", "train", QUICKSTART, *overrides]
    supervise = [sys.executable, "-m", "agentrl.cli", "supervise", "--max-restarts", str(max_restarts)]
    return cluster.exec_argv(0, [*supervise, "--backoff-s", "1", "--", *hydra_argv(hosts, train)], cwd=str(ROOT))


def job_env(**extra: str) -> dict[str, str]:
    """UCX_TLS=tcp,self: MPICH's UCX would otherwise reach another node's ranks by shared memory (one machine,
    one PID namespace: cross-memory attach works), and nothing would cross the bridge."""
    return {
        "UCX_TLS": "tcp,self",
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "TRANSFORMERS_VERBOSITY": "error",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **extra,
    }


class Lines:
    """A started job's stdout and stderr lines, each with the monotonic time it arrived (read by threads)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.lines: list[tuple[float, str]] = []
        self.threads = [
            threading.Thread(target=self._read, args=(pipe,), daemon=True) for pipe in (process.stdout, process.stderr)
        ]
        for thread in self.threads:
            thread.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, needle: str) -> float | None:
        return next((at for at, line in list(self.lines) if needle in line), None)

    def text(self) -> str:
        return "\n".join(line for _, line in list(self.lines))

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()
            raise AssertionError(f"the job did not end within {timeout_s} s:\n{self.text()[-6000:]}") from None
        for thread in self.threads:
            thread.join(timeout=5)
        return code


def train_argv_inner(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "agentrl.cli", "train", QUICKSTART, *overrides]


def train_argv(hosts: dict[str, int], overrides: list[str]) -> list[str]:
    return mpirun_argv(hosts, train_argv_inner(overrides))


def run(argv: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, env=job_env(**env), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"{' '.join(argv)} hung past {timeout}s\n{error.stdout}\n{error.stderr}") from None


def start(argv: list[str], **env: str) -> subprocess.Popen:
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen(argv, env=job_env(**env), cwd=ROOT, start_new_session=True, **pipes)


def shared_dir(name: str) -> Path:
    """A fresh folder every node sees (the test bed's state folder, not /tmp, which is private per node)."""
    path = cluster.STATE / "shared" / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
