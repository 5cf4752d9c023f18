"""Real `mpirun -n 3` runs (trainer, rollout, env rank) on reasoning-gym's and TextArena's own environments through
their adapters: the env rank builds and serves them, and the run trains."""

import pytest

from tests.mpi.helpers import assert_ok, scalars, small_run, train

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]  # three ranks each import the package

ENVS = {
    "reasoning_gym": {
        "env.id": "reasoning_gym:basic_arithmetic",
        "env.kwargs": "{min_terms: 2, max_terms: 2, max_digits: 1, operators: ['+'], answer_tag: null}",
        "rollout.max_turns": 1,
    },
    "textarena": {
        "env.id": "textarena:GuessTheNumber-v0",
        "env.kwargs": "{min_number: 1, max_number: 7, max_turns: 3, bracket_actions: true}",
        "rollout.max_turns": 4,
    },
}


@pytest.mark.parametrize("package", ["reasoning_gym", "textarena"])
def test_an_ecosystem_env_on_an_env_rank_trains(tmp_path, tiny_model_dir, package):
    pytest.importorskip(package, reason=f"pip install 'agentrl[{package.replace('_', '-')}]' (in the dev extra)")
    settings = {"layout.env": 1, "steps": 2, "rollout.tasks_per_step": 2, **ENVS[package]}
    assert_ok(train(3, small_run(tmp_path, tiny_model_dir, **settings), timeout=800))
    logged = scalars(tmp_path / "run")
    assert [step for step, _ in logged["train/loss"]] == [0, 1]
    assert sum(failed for _, failed in logged["episode/failed"]) == 0
    assert all(count == 8 for _, count in logged["episode/count"])
