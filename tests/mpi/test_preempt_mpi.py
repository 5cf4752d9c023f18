"""A signal mid-run: mpirun forwards SIGUSR1, the ranks stop at a step boundary with a checkpoint, resume finishes."""

import os
import signal
import subprocess

import pytest

from agentrl.run.preempt import EXIT_STOPPED
from agentrl.trainer import checkpoint
from tests.mpi.helpers import assert_ok, scalars, small_run, start_training, train, wait_for

pytestmark = pytest.mark.mpi

STEPS = 20


def test_sigusr1_checkpoints_and_resume_finishes(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    layout = {"layout.trainer": 1, "layout.rollout": 1, "layout.env": 1, "checkpoint.every": 3}
    process = start_training(3, small_run(tmp_path, tiny_model_dir, steps=STEPS, **layout))
    wait_for(lambda: checkpoint.latest(run) is not None, 120, process)  # past step 3: the handlers are installed
    process.send_signal(signal.SIGUSR1)  # to mpirun only: the launcher forwards it to every rank
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stderr = process.communicate()[1]
        raise AssertionError(f"the job did not stop within 60 s of SIGUSR1:\n{stderr[-4000:]}") from None
    assert process.returncode == EXIT_STOPPED, f"exit {process.returncode}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    stopped_at = checkpoint.latest(run)[0]
    assert 3 <= stopped_at < STEPS
    assert f"stopped by signal at step {stopped_at}, checkpoint written" in out
    assert sorted(s for s, _ in scalars(run)["episode/count"]) == list(range(stopped_at))

    assert_ok(train(3, small_run(tmp_path, tiny_model_dir, steps=STEPS, resume="true", **layout)))
    assert sorted(s for s, _ in scalars(run)["episode/count"]) == list(range(STEPS))  # none lost or repeated
    assert checkpoint.latest(run)[0] == STEPS
