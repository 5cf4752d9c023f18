"""Launching real mpirun jobs from pytest, with timeouts, and reading their TensorBoard files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, mpirun_command

SCRIPTS = Path(__file__).parent / "scripts"


def mpirun(n: int, args: list[str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error"}
    command = [*mpirun_command(n), sys.executable, *args]
    try:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(
            f"mpirun -n {n} {' '.join(args)} hung past {timeout}s\nstdout:\n{error.stdout}\nstderr:\n{error.stderr}"
        ) from None


def train(n: int, overrides: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    config = str(ROOT / "launch" / "configs" / "quickstart.yaml")
    return mpirun(n, ["-m", "agentrl.cli", "train", config, *overrides], timeout)


def script(n: int, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return mpirun(n, [str(SCRIPTS / name), *args], timeout)


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return out


def small_run(tmp_path: Path, model_dir: Path, **extra) -> list[str]:
    """Overrides for a seconds-long run on the tiny test model."""
    settings = {
        "run_dir": tmp_path / "run",
        "model.path": model_dir,
        "steps": 3,
        "rollout.tasks_per_step": 4,
        "rollout.group_size": 4,
        "checkpoint.every": 0,
        "logging.progress": "false",
        "layout.trainer": 1,
        "layout.rollout": 1,
        "layout.env": 0,
        **extra,
    }
    return [f"{key}={value}" for key, value in settings.items()]


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-6000:]}"
    )
