"""`agentrl train` (world size 1) takes its rewards from an `agentrl serve` judge over HTTP, or from a reward model
in-process; a judge that is down stops the run at its first step with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.mpi.helpers import scalars
from tests.unit.judge_servers import MODEL, served_tiny_judge
from tests.unit.serve_server import free_port
from tests.unit.test_judge import SCORE_SCHEMA

STEPS = 2
EPISODES = 8  # per step: 2 tasks x 4


def train(tmp_path, reward: dict) -> tuple[subprocess.CompletedProcess, dict]:
    config = {
        "run_dir": str(tmp_path / "run"),
        "steps": STEPS,
        "layout": {"trainer": 1, "rollout": 1, "env": 0},
        "model": {"path": str(tmp_path / "policy"), "tiny": {"hidden_size": 32, "num_layers": 1, "vocab_size": 96}},
        "env": {"id": "guess_number", "kwargs": {"low": 1, "high": 9, "max_guesses": 2}},
        "reward": reward,
        "rollout": {"tasks_per_step": 2, "group_size": 4, "max_turns": 2, "max_new_tokens": 2},
        "checkpoint": {"every": 0},
        "logging": {"progress": False, "sample_every": 0},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "agentrl.cli", "train", str(tmp_path / "config.yaml")]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, cwd=ROOT)
    logged = scalars(tmp_path / "run") if (tmp_path / "run" / "tb").exists() else {}
    return result, logged


def test_training_takes_its_rewards_from_an_agentrl_serve_judge(tmp_path):
    with served_tiny_judge(tmp_path) as judge:
        judge_options = {
            "base_url": judge.base_url + "/v1",
            "model": MODEL,
            "rubric": "Rate the guesses from 0 to 9.\n{transcript}",
            "score_format": "json",
            "score_range": [0, 9],
            "max_tokens": 16,
            "request_extra": {"response_format": SCORE_SCHEMA},
        }
        result, logged = train(tmp_path, {"judge": judge_options})
        calls = len(judge.records)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-5000:]}"
    assert [value for _, value in logged["episode/failed"]] == [0.0] * STEPS
    assert [value for _, value in logged["episode/count"]] == [EPISODES] * STEPS
    assert all(0.0 <= value <= 1.0 for _, value in logged["episode/reward_mean"])
    assert all(value > 0 for _, value in logged["episode/score_wait_s_mean"])
    cached = sum(value for _, value in logged["episode/score_cached_mean"]) * EPISODES
    assert calls == round(STEPS * EPISODES - cached) > 0  # one judge call per transcript not seen before


def test_a_judge_that_is_down_stops_the_run_at_its_first_step_with_the_reason(tmp_path):
    judge = {"base_url": f"http://127.0.0.1:{free_port()}/v1", "model": MODEL, "rubric": "{completion}"}
    result, _ = train(tmp_path, {"judge": judge})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"step 0: {EPISODES} of {EPISODES} episodes failed with the same error" in output
    assert "reward.judge (tiny-judge at http://127.0.0.1:" in output and "cannot reach the judge" in output


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from tests.unit.test_reward_model import build_reward_model

    return build_reward_model(tmp_path_factory.mktemp("reward_model"))


def test_training_takes_its_rewards_from_a_reward_model_in_process(tmp_path, reward_model_dir):
    result, logged = train(tmp_path, {"model": {"path": str(reward_model_dir), "transform": "sigmoid"}})
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-5000:]}"
    assert [value for _, value in logged["episode/failed"]] == [0.0] * STEPS
    assert all(0.0 < value < 1.0 for _, value in logged["episode/reward_mean"])  # sigmoid of the head's logits
