"""`sbatch --array=0-N%K slurm/sweep.sh SPEC` on a real single-node SLURM: each array task claims one trial of the
shared study (a file journal) and runs it; every trial runs once, in its own run folder."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.slurm.test_sbatch import FINAL_STATES

pytestmark = pytest.mark.slurm
pytest.importorskip("optuna")


def test_sweep_as_a_job_array_runs_each_trial_once(slurm_cluster, tmp_path, tiny_model_dir):
    spec = tmp_path / "spec.yaml"
    sweep_dir = tmp_path / "sweep"
    overrides = {"model.path": str(tiny_model_dir), "steps": 2, "rollout.tasks_per_step": 2, "rollout.group_size": 2}
    overrides["eval"] = {"every": 2, "seeds": [1000000, 4]}
    spec.write_text(
        yaml.safe_dump(
            {
                "base": str(ROOT / "launch" / "configs" / "quickstart.yaml"),
                "sweep_dir": str(sweep_dir),
                "overrides": overrides,
                "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}},
                "seeds": [0, 1],
                "method": "tpe",
                "trials": 4,
                "concurrency": 2,
            }
        )
    )
    env = {**slurm_cluster.env, "AGENTRL_VENV": str(Path(sys.executable).parent.parent), "PYTHONPATH": str(ROOT)}
    command = ["sbatch", "--parsable", "--array=0-3%2", f"--output={tmp_path / 'slurm-%A_%a.out'}"]
    submitted = subprocess.run(
        [*command, "slurm/sweep.sh", str(spec)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    import time

    deadline = time.monotonic() + 300
    while True:
        shown = slurm_cluster.run("squeue", "--noheader", "--jobs", job, check=False).stdout.strip()
        if not shown:
            break
        assert time.monotonic() < deadline, shown
        time.sleep(1)
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("slurm-*.out")))
    accounting = slurm_cluster.run("scontrol", "show", "job", job, check=False).stdout
    assert all(state not in accounting for state in FINAL_STATES - {"COMPLETED"}), accounting + logs
    status = subprocess.run(
        [str(Path(sys.executable).parent / "agentrl"), "sweep", "status", str(sweep_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr + logs
    with open(sweep_dir / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["trial"] for row in rows] == ["0", "1", "2", "3"], logs
    assert all(row["state"] == "complete" for row in rows), status.stdout + logs
    assert sorted(row["seed"] for row in rows) == ["0", "0", "1", "1"]  # each point on both seeds
    assert len({row["optimizer.lr"] for row in rows}) == 2
    jobs = {yaml.safe_load((sweep_dir / "runners" / f"{n:04d}.json").read_text())["slurm_job"] for n in range(4)}
    assert len(jobs) == 4  # four array tasks, one trial each
    assert logs.count("trial") >= 4 and "starts" in logs
