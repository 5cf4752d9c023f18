"""MPI jobs across the test bed's nodes: hydra started on node0, proxies entering each node through `node_ssh`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.multinode import cluster

QUICKSTART = str(ROOT / "launch" / "configs" / "quickstart.yaml")


def mpirun() -> str:
    found = shutil.which("mpirun", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("no mpirun next to this python: pip install mpich (bash launch/setup.sh)")
    return found


def mpirun_argv(hosts: dict[str, int], argv: list[str]) -> list[str]:
    """`mpirun` of `argv` with hosts[name] ranks on each node in order (block placement), run from node0."""
    spec = ",".join(f"{name}:{count}" for name, count in hosts.items())
    command = [mpirun(), "-launcher", "ssh", "-launcher-exec", str(cluster.NODE_SSH), "-hosts", spec]
    return cluster.exec_argv(0, [*command, "-n", str(sum(hosts.values())), *argv], cwd=str(ROOT))


def job_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "TRANSFORMERS_VERBOSITY": "error",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **extra,
    }


def train_argv(hosts: dict[str, int], overrides: list[str]) -> list[str]:
    return mpirun_argv(hosts, [sys.executable, "-m", "agentrl.cli", "train", QUICKSTART, *overrides])


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
