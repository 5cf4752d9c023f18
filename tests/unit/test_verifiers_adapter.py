"""verifiers environments through the gateway: `env.id: verifiers:TASKSET` runs verifiers' own Env, harness (the
null chat loop in a subprocess runtime) and rubric against the episode's session; two tasksets built from verifiers'
classes (tests/verifiers_tasksets: one-turn additions, and a two-turn scripted user) train two steps with exact
tokens, and a rubric that raises fails its episodes with the reason, counted.

Marked `verifiers`: verifiers is about 90 MB and pins openai<3 (not in the dev extra), and its harness program runs
under uv, which fetches the program's packages from PyPI once; `pip install 'agentrl[verifiers]'`, `pytest -m
verifiers`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agentrl.config.load import from_dict

pytest.importorskip("verifiers.v1", reason="pip install 'agentrl[verifiers]'")
pytestmark = [pytest.mark.verifiers, pytest.mark.timeout(1800)]

TASKSETS = Path(__file__).resolve().parents[1] / "verifiers_tasksets"


def test_a_verifiers_env_id_becomes_the_agent_program_and_bad_kwargs_are_named():
    config = from_dict({"model": {"path": "m"}, "env": {"id": "verifiers:agentrl_vf_addition"}})
    assert config.agent.command[1:] == [
        "-m",
        "agentrl.env.adapters.verifiers",
        "agentrl_vf_addition",
        "--model",
        "policy",
        "--harness",
        "null",
    ]
    with pytest.raises(ValueError, match=r"\['turns'\] are not options of verifiers:agentrl_vf_addition"):
        from_dict({"model": {"path": "m"}, "env": {"id": "verifiers:agentrl_vf_addition", "kwargs": {"turns": 2}}})


def test_making_it_as_a_text_env_says_it_runs_through_the_gateway():
    from agentrl.env import make

    with pytest.raises(ValueError, match=r"training gateway\. Set env\.id: verifiers:agentrl_vf_addition"):
        make("verifiers:agentrl_vf_addition")


def test_check_env_builds_the_env_and_its_tasks_and_names_a_missing_taskset(capsys, monkeypatch):
    from agentrl.cli import main

    monkeypatch.syspath_prepend(str(TASKSETS))
    assert main(["check-env", "verifiers:agentrl_vf_followup"]) == 0
    assert "12 tasks, env FollowupEnv, harness null" in capsys.readouterr().out
    assert main(["check-env", "verifiers:nosuch_taskset"]) == 1
    assert "taskset 'nosuch_taskset' not found" in capsys.readouterr().out


CONFIG = """
run_dir: {run_dir}
steps: {steps}
seed: 0
model:
  path: {model}
  tiny: {{hidden_size: 32, num_layers: 2, num_heads: 4, vocab_size: 256}}
env:
  id: verifiers:{taskset}
agent: {{timeout_s: 900}}
rollout: {{tasks_per_step: 2, group_size: 2, max_new_tokens: 8, max_episode_tokens: 512}}
trainer: {{micro_batch_size: 8}}
runtime: {{abort_on_failed_fraction: null}}
checkpoint: {{every: 0}}
logging: {{progress: false}}
"""


def train(tmp_path, taskset, steps):
    run_dir = tmp_path / "run"
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(run_dir=run_dir, steps=steps, model=tmp_path / "model", taskset=taskset))
    environment = {**os.environ, "PYTHONPATH": str(TASKSETS), "OMP_NUM_THREADS": "1"}
    trained = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(config)],
        capture_output=True,
        text=True,
        timeout=1700,
        cwd=tmp_path,
        env=environment,
    )
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-4000:]
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return events, trained


@pytest.mark.parametrize("taskset", ["agentrl_vf_addition", "agentrl_vf_followup"])
def test_two_training_steps_on_a_verifiers_environment(taskset, tmp_path):
    events, _ = train(tmp_path, taskset, steps=2)
    assert [event.value for event in events.Scalars("episode/count")] == [4.0, 4.0]
    assert [event.value for event in events.Scalars("episode/failed")] == [0.0, 0.0]
    assert len(events.Scalars("train/loss")) == 2
    turns = [event.value for event in events.Scalars("episode/turns_mean")]
    assert turns == ([1.0, 1.0] if taskset == "agentrl_vf_addition" else [2.0, 2.0])  # one model call per turn


def test_a_rubric_that_raises_fails_its_episodes_with_the_reason(tmp_path):
    events, trained = train(tmp_path, "agentrl_vf_broken", steps=1)
    assert [event.value for event in events.Scalars("episode/failed")] == [4.0]
    assert "this rubric is broken on purpose" in trained.stdout + trained.stderr
