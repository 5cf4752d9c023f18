"""Real `mpirun -n 3` runs (trainer, rollout, env rank) whose env plugin raises, hangs, or kills its sandbox
process: the run finishes and the counts reconcile. A broken env, or a step in which every episode failed
alike, stops every rank instead."""

import time

import pytest

from agentrl.data.tasks import task_seed
from tests.fault_envs import fails
from tests.mpi.helpers import assert_ok, scalars, small_run, train

pytestmark = pytest.mark.mpi


ENVS = {
    "raise": {"env.id": "tests.fault_envs:FaultyEnv", "env.kwargs": "{fault: raise, every: 3}"},
    "exit": {
        "env.id": "agentrl.env.subprocess_env:SubprocessEnv",
        "env.kwargs": "{env_id: 'tests.fault_envs:FaultyEnv', kwargs: {fault: exit, every: 3}}",
    },
    "hang": {  # in-process: the hung call's thread is abandoned, its episode ends at the timeout
        "env.id": "tests.fault_envs:FaultyEnv",
        "env.kwargs": "{fault: hang, every: 3}",
        "runtime.env_step_timeout_s": 5,
    },
}


@pytest.mark.parametrize("fault", ["raise", "exit", "hang"])
def test_faulty_env_plugin_on_an_env_rank(tmp_path, tiny_model_dir, fault):
    faults = ENVS[fault]
    assert_ok(train(3, small_run(tmp_path, tiny_model_dir, **{"layout.env": 1}, **faults)))
    logged = scalars(tmp_path / "run")
    for step, failed in logged["episode/failed"]:
        expected = 4 * sum(fails(task_seed(0, step, task), 3) for task in range(4))  # 4 episodes per task
        assert failed == expected
    failed_total = sum(v for _, v in logged["episode/failed"])
    print(f"fault={fault}: {16 * len(logged['episode/count'])} episodes started, {failed_total:.0f} failed")
    assert failed_total > 0  # the seeds do inject faults
    assert all(v == 16 for _, v in logged["episode/count"])  # none lost: started = finished + failed
    finish = {name: dict(values) for name, values in logged.items() if name.startswith("episode/finish_")}
    for step, count in logged["episode/count"]:
        assert sum(fractions[step] for fractions in finish.values()) * count == pytest.approx(16)
        assert finish["episode/finish_error"][step] * count == pytest.approx(dict(logged["episode/failed"])[step])


BROKEN = {
    "unknown id": ({"env.id": "nope"}, "env.id='nope' names no environment: unknown env id 'nope'"),
    "missing class": ({"env.id": "envs.guess_number:Missing"}, "has no attribute 'Missing'"),
    "kwargs typo": ({"env.kwargs.nonsense": 1}, "unexpected keyword argument 'nonsense'"),
    "gymnasium env": (
        {"env.id": "gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv", "env.kwargs": "{}"},
        "env.id=toy_text env.kwargs.game=FrozenLake-v1",
    ),
}


@pytest.mark.parametrize(("ranks", "case"), [(3, name) for name in BROKEN] + [(1, "unknown id")])
def test_a_broken_env_stops_every_rank_before_training(tmp_path, tiny_model_dir, ranks, case):
    overrides, expected = BROKEN[case]
    layout = {"layout.env": 1} if ranks == 3 else {}
    started = time.monotonic()
    result = train(ranks, small_run(tmp_path, tiny_model_dir, **layout, **overrides), timeout=120)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    print(f"{case}, {ranks} ranks: exit {result.returncode} after {seconds:.1f} s:\n{output}")
    assert result.returncode == 2, output
    assert expected in result.stderr
    assert output.count("agentrl: env.") == 1 and "Traceback" not in output  # one message, printed once
    assert not (tmp_path / "run").exists()  # no run folder, no checkpoint
    assert seconds < 30


def test_an_env_that_cannot_be_built_on_its_env_rank_aborts_the_job(tmp_path, tiny_model_dir):
    overrides = {"layout.env": 1, "env.id": "tests.fault_envs:BuildsOnRankZeroOnly", "env.kwargs": "{}"}
    started = time.monotonic()
    result = train(3, small_run(tmp_path, tiny_model_dir, **overrides), timeout=120)
    seconds = time.monotonic() - started
    assert result.returncode != 0
    # a user error on one rank: its message once, no traceback, and the job ends with exit code 2
    assert "agentrl (rank 2): env.id='tests.fault_envs:BuildsOnRankZeroOnly' with env.kwargs={} cannot be built" in (
        result.stderr
    )
    assert "words.txt is missing on rank 2" in result.stderr and "Traceback" not in result.stderr
    assert not list((tmp_path / "run").glob("checkpoints/step_*"))
    assert seconds < 60, f"took {seconds:.1f} s"


ALWAYS_FAILS = {"env.id": "tests.fault_envs:FaultyEnv", "env.kwargs": "{fault: raise, every: 1}"}


@pytest.mark.parametrize("ranks", [3, 1])
def test_a_step_in_which_every_episode_failed_alike_stops_the_run(tmp_path, tiny_model_dir, ranks):
    layout = {"layout.env": 1} if ranks == 3 else {}
    result = train(ranks, small_run(tmp_path, tiny_model_dir, **layout, **ALWAYS_FAILS), timeout=180)
    assert result.returncode != 0
    stopped = "step 0: 16 of 16 episodes failed with the same error, at or above runtime.abort_on_failed_fraction=1.0"
    assert result.stderr.count(stopped) == 1, result.stderr[-3000:]
    assert "RuntimeError: injected fault for seed" in result.stderr.split(stopped)[1]
    assert not list((tmp_path / "run").glob("checkpoints/step_*"))


def test_null_keeps_training_through_failing_steps(tmp_path, tiny_model_dir):
    overrides = {"layout.env": 1, "runtime.abort_on_failed_fraction": "null", **ALWAYS_FAILS}
    assert_ok(train(3, small_run(tmp_path, tiny_model_dir, **overrides)))
    assert [v for _, v in scalars(tmp_path / "run")["episode/failed"]] == [16, 16, 16]
