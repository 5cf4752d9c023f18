"""Real `mpirun -n 3` runs (trainer, rollout, env rank) whose env plugin raises, hangs, or kills its sandbox
process: the run finishes and the counts reconcile."""

import pytest

from agentrl.rollout.worker import task_seed
from tests.fault_envs import fails
from tests.mpi.helpers import assert_ok, scalars, small_run, train

pytestmark = pytest.mark.mpi


ENVS = {
    "raise": {"env.id": "tests.fault_envs:FaultyEnv", "env.kwargs": "{fault: raise, every: 3}"},
    "exit": {
        "env.id": "agentrl.env.sandbox:SubprocessEnv",
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
