"""`sbatch slurm/train.sh` on a real single-node SLURM: mpirun and srun launchers, and requeue mid-run."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.trainer import checkpoint
from tests.conftest import ROOT
from tests.mpi.helpers import scalars

pytestmark = pytest.mark.slurm

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def overrides(tmp_path: Path, model_dir: Path, steps: int, every: int = 0) -> list[str]:
    settings = {
        "run_dir": tmp_path / "run",
        "model.path": model_dir,
        "steps": steps,
        "checkpoint.every": every,
        "rollout.tasks_per_step": 4,
        "rollout.group_size": 4,
        "logging.progress": "false",
        "layout.trainer": 1,
        "layout.rollout": 2,
        "layout.env": 1,
    }
    return [f"{key}={value}" for key, value in settings.items()]


def submit(cluster, tmp_path: Path, args: list[str], launcher: str = "mpirun") -> str:
    env = {
        **cluster.env,
        "AGENTRL_LAUNCHER": launcher,
        "AGENTRL_VENV": str(Path(sys.executable).parent.parent),
        "PYTHONPATH": str(ROOT),
        "TRANSFORMERS_VERBOSITY": "error",
    }
    command = ["sbatch", "--parsable", f"--output={tmp_path / 'slurm-%j.out'}", "slurm/train.sh"]
    command += [str(ROOT / "launch" / "configs" / "quickstart.yaml"), *args]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job_field(cluster, job: str, field: str) -> str:
    shown = cluster.run("scontrol", "show", "job", job).stdout
    return re.search(rf"\b{field}=(\S+)", shown).group(1)


def wait_for_job(cluster, job: str, tmp_path: Path, restarts: int = 0, timeout_s: float = 180) -> str:
    """Poll until the job ends after being requeued `restarts` times (held cred_expire seconds in between).

    A job being requeued can show a final state for a moment, so with `restarts` the job must first be
    seen pending or running again.
    """
    deadline = time.monotonic() + timeout_s
    states: list[str] = []
    requeued = restarts == 0
    while True:
        state = job_field(cluster, job, "JobState")
        if not states or states[-1] != state:
            states.append(state)
        if not requeued:
            requeued = state in ("PENDING", "RUNNING") and int(job_field(cluster, job, "Restarts")) >= restarts
        elif state in FINAL_STATES:
            return state
        if time.monotonic() > deadline:
            cluster.run("scancel", job, check=False)
            raise AssertionError(f"job {job} went {' -> '.join(states)} in {timeout_s}s:\n{job_log(tmp_path, job)}")
        time.sleep(0.5)


def job_log(tmp_path: Path, job: str) -> str:
    path = tmp_path / f"slurm-{job}.out"
    return path.read_text() if path.exists() else "(no job output)"


def assert_completed(cluster, job: str, tmp_path: Path, steps: int, restarts: int = 0) -> None:
    state = wait_for_job(cluster, job, tmp_path, restarts)
    log = job_log(tmp_path, job)
    assert state == "COMPLETED" and job_field(cluster, job, "ExitCode") == "0:0", f"{state}\n{log[-6000:]}"
    run = tmp_path / "run"
    assert checkpoint.latest(run)[0] == steps, log[-6000:]
    assert sorted(s for s, _ in scalars(run)["episode/count"]) == list(range(steps))  # no step lost or repeated
    assert "rank  role" in log  # the script printed the placement


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_sbatch_trains(slurm_cluster, tmp_path, tiny_model_dir, launcher):
    job = submit(slurm_cluster, tmp_path, overrides(tmp_path, tiny_model_dir, steps=3), launcher)
    assert_completed(slurm_cluster, job, tmp_path, steps=3)
    assert "world=4" in job_log(tmp_path, job)


def wait_for_checkpoint(cluster, job: str, tmp_path: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while checkpoint.latest(tmp_path / "run") is None:
        if time.monotonic() > deadline or job_field(cluster, job, "JobState") in FINAL_STATES:
            raise AssertionError(f"job {job} wrote no checkpoint:\n{job_log(tmp_path, job)}")
        time.sleep(0.5)


@pytest.mark.parametrize("how", ["usr1_to_batch_script", "scontrol_requeue"])
def test_requeued_job_resumes_without_losing_a_step(slurm_cluster, tmp_path, tiny_model_dir, how):
    steps = 40
    job = submit(slurm_cluster, tmp_path, overrides(tmp_path, tiny_model_dir, steps=steps, every=3))
    wait_for_checkpoint(slurm_cluster, job, tmp_path)
    config_before = (tmp_path / "run" / "config.yaml").read_text()
    if how == "usr1_to_batch_script":  # what --signal=B:USR1@120 does before the time limit
        slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    else:  # an admin or a preempting job: SIGTERM to every process, then SLURM requeues
        slurm_cluster.run("scontrol", "requeue", job)
    assert_completed(slurm_cluster, job, tmp_path, steps, restarts=1)
    log = job_log(tmp_path, job)
    stopped = re.search(r"stopped by signal at step (\d+), checkpoint written", log)
    assert stopped, log[-6000:]
    print(f"\n{how}: job {job} stopped at step {stopped.group(1)}, requeued, resumed and finished step {steps}")
    assert job_field(slurm_cluster, job, "Restarts") == "1"
    assert "restart 1" in log
    assert (tmp_path / "run" / "config.yaml").read_text() == config_before
