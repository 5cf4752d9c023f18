"""A real `agentrl train` (world size 1) through the gateway with an agent program of a test's own, on the serve
tests' tiny model and eight arithmetic rows; what the tests of agent rewards read back from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT
from tests.mpi.helpers import scalars
from tests.unit.serve_server import build_serve_model


@dataclass
class AgentTraining:
    result: subprocess.CompletedProcess
    model: Path  # the initial model's folder
    run_dir: Path
    logged: dict  # the run's scalars, by tag

    @property
    def output(self) -> str:
        return self.result.stdout + self.result.stderr


def train_agent(tmp_path: Path, agent: str, steps: int, env: dict | None = None, **overrides) -> AgentTraining:
    """`steps` steps of 2 tasks x 4 episodes, each episode a run of the program `agent` (Python source); `overrides`
    (dotted keys) over the quickstart's config, `env` added to the program's environment. Asserts it exited 0."""
    model = build_serve_model(tmp_path / "tiny")
    rows = [{"question": f"What is {i} + 1?", "answer": i + 1} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "agent.py").write_text(agent)
    run_dir = tmp_path / "run"
    settings = {
        "run_dir": run_dir,
        "layout.rollout": 1,
        "layout.env": 0,
        "model.path": model,
        "steps": steps,
        "rollout.tasks_per_step": 2,
        "rollout.group_size": 4,
        "rollout.max_new_tokens": 6,
        "data.train": tmp_path / "train.jsonl",
        "agent.command": f"{sys.executable} {tmp_path / 'agent.py'}",
        "agent.timeout_s": 120,
        "eval.every": 0,
        "checkpoint.every": 0,
        "logging.progress": "false",
        **overrides,
    }
    command = [sys.executable, "-m", "agentrl.cli", "train", "launch/configs/quickstart.yaml"]
    command += [f"{key}={value}" for key, value in settings.items()]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-5000:]}"
    return AgentTraining(result, model, run_dir, scalars(run_dir))
