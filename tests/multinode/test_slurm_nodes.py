"""`sbatch -N 2 slurm/train.sh` on a real SLURM across two nodes of the test bed (one slurmd per node)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.trainer import checkpoint
from tests.conftest import ROOT
from tests.mpi.helpers import scalars
from tests.multinode import jobs, slurm
from tests.multinode.test_nodes import run_settings
from tests.slurm.cluster import install_packages

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm_nodes(nodes):
    why = install_packages()
    if why:
        pytest.skip(why)
    try:
        yield slurm.start(len(nodes))
    finally:
        slurm.stop()


def scontrol_field(job: str, field: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job], env=slurm.client_env(), capture_output=True, text=True)
    return next((item.split("=", 1)[1] for item in shown.stdout.split() if item.startswith(f"{field}=")), "")


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_sbatch_trains_across_two_nodes(slurm_nodes, shared_model, launcher):
    folder = jobs.shared_dir(f"sbatch-{launcher}")
    env = {
        **jobs.job_env(),
        **slurm.client_env(),
        "AGENTRL_LAUNCHER": launcher,
        "AGENTRL_VENV": str(Path(sys.executable).parents[1]),
    }
    command = ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2", f"--output={folder}/slurm-%j.out"]
    command += ["slurm/train.sh", jobs.QUICKSTART, *run_settings(folder / "run", shared_model)]
    submitted = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while scontrol_field(job, "JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", ""):
        assert time.monotonic() < deadline, f"job {job} still {scontrol_field(job, 'JobState')}"
        time.sleep(1)
    log = (folder / f"slurm-{job}.out").read_text()
    assert scontrol_field(job, "JobState") == "COMPLETED", log[-6000:]
    assert scontrol_field(job, "NodeList") == "node[0-1]"
    assert log.count("node1  cpu     bcast+shm") == 2, log  # agentrl layout and the job itself: same nodes
    assert checkpoint.latest(folder / "run")[0] == 3
    assert sorted(step for step, _ in scalars(folder / "run")["episode/count"]) == [0, 1, 2]
