"""A real `agentrl train` of a tiny from-scratch model, two steps on an ecosystem's env, in its own process."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def train_two_steps(env_id: str, env_kwargs: dict, tmp_path: Path, max_turns: int = 1, **rollout) -> Path:
    """Run 2 steps of the quickstart's config on `env_id` in one process; the run folder (asserts it exited 0)."""
    config = yaml.safe_load((REPO / "launch/configs/quickstart.yaml").read_text())
    run_dir = tmp_path / "run"
    config.update(run_dir=str(run_dir), steps=2, eval={"every": 0}, checkpoint={"every": 0})
    config["model"] = {
        "path": str(tmp_path / "model"),
        "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "vocab_size": 128},
    }
    config["env"] = {"id": env_id, "kwargs": env_kwargs}
    config["rollout"].update(tasks_per_step=2, group_size=4, max_turns=max_turns, max_new_tokens=4, **rollout)
    config["logging"] = {"progress": False}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "agentrl.cli", "train", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=REPO, env=environment)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return run_dir
