"""verifiers environments through the gateway: `env.id: verifiers:TASKSET` runs verifiers' own Env, harness (the
null chat loop in a subprocess runtime) and rubric against the episode's session; two tasksets built from verifiers'
classes (tests/verifiers_tasksets: one-turn additions, and a two-turn scripted user) train two steps with exact
tokens, and a rubric that raises fails its episodes with the reason, counted.

Marked `verifiers`: verifiers is about 90 MB and pins openai<3 (not in the dev extra), and its harness program runs
under uv, which fetches the program's packages from PyPI once; `pip install 'agentrl[verifiers]'`, `pytest -m
verifiers`."""

from pathlib import Path

import pytest

from agentrl.config.load import from_dict
from tests.mpi.helpers import scalars
from tests.unit.ecosystem_runs import (
    ON_AN_ENV_RANK,
    agentrl,
    assert_clean_steps,
    evaluate,
    run_dir_of,
    train,
    write_config,
)

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


# one model call per turn, of up to 8 tokens; verifiers' episodes take minutes on a loaded machine
VERIFIERS_RUN = {
    "model.tiny.vocab_size": 256,
    "agent.timeout_s": 900,
    "rollout.group_size": 2,
    "rollout.max_new_tokens": 8,
    "rollout.max_episode_tokens": 512,
    "runtime.abort_on_failed_fraction": None,
}
WITH_TASKSETS = {"PYTHONPATH": str(TASKSETS)}


def run_config(tmp_path, taskset: str, steps: int, **settings):
    return write_config(tmp_path, f"verifiers:{taskset}", steps=steps, **VERIFIERS_RUN, **settings)


@pytest.mark.parametrize("taskset", ["agentrl_vf_addition", "agentrl_vf_followup"])
def test_two_training_steps_on_a_verifiers_environment(taskset, tmp_path):
    logged = train(run_config(tmp_path, taskset, steps=2), env=WITH_TASKSETS, timeout=1700)
    assert_clean_steps(logged, steps=2, episodes=4)
    turns = [value for _, value in logged["episode/turns_mean"]]
    assert turns == ([1.0, 1.0] if taskset == "agentrl_vf_addition" else [2.0, 2.0])  # one model call per turn


def test_a_rubric_that_raises_fails_its_episodes_with_the_reason(tmp_path):
    config = run_config(tmp_path, "agentrl_vf_broken", steps=1)
    trained = agentrl("train", config, env=WITH_TASKSETS, timeout=1700)
    assert [failed for _, failed in scalars(run_dir_of(config))["episode/failed"]] == [4.0]
    assert "this rubric is broken on purpose" in trained.stdout + trained.stderr


def test_a_step_with_the_episodes_on_an_env_rank_then_agentrl_eval(tmp_path):
    """mpirun -n 3: the env rank starts the verifiers program of each episode against the rollout rank's gateway;
    then `agentrl eval` of the trained model (one process) on two tasks."""
    config = run_config(tmp_path, "agentrl_vf_addition", steps=1, **ON_AN_ENV_RANK)
    logged = train(config, ranks=3, env=WITH_TASKSETS, timeout=1700)
    assert_clean_steps(logged, steps=1, episodes=4)
    assert [value for _, value in logged["episode/turns_mean"]] == [1.0]
    report = evaluate(config, "eval.seeds=[0,2]", "eval.n=1", env=WITH_TASKSETS, timeout=1700)
    assert report["metrics"]["episodes"] == 2 and report["metrics"]["failed"] == 0
