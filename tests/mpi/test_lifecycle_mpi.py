"""A run's life under real mpirun: one run per run_dir, damaged checkpoints, a signal to one rank, Ctrl-C, errors."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from agentrl.errors import EXIT_USER_ERROR
from agentrl.run.preempt import EXIT_STOPPED
from agentrl.trainer import checkpoint
from agentrl.transport import EXIT_INTERRUPTED
from tests.conftest import ROOT
from tests.mpi.helpers import (
    QUICKSTART,
    assert_ok,
    finish,
    job_env,
    rank_pids,
    scalars,
    small_run,
    start_training,
    train,
    wait_for,
)

pytestmark = pytest.mark.mpi

THREE_RANKS = {"layout.trainer": 1, "layout.rollout": 1, "layout.env": 1}
LONG_RUN = {"steps": 500, "checkpoint.every": 2, **THREE_RANKS}


def one_message(result_text: str, needle: str) -> None:
    """The text holds `needle` exactly once and no traceback."""
    assert result_text.count(needle) == 1, result_text[-4000:]
    assert "Traceback" not in result_text, result_text[-4000:]


def test_a_second_run_in_the_same_run_dir_is_refused_and_the_lock_released(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    first = start_training(3, small_run(tmp_path, tiny_model_dir, steps=500, seed=0, **THREE_RANKS))
    wait_for(lambda: (run / ".lock").is_file() and (run / "config.yaml").is_file(), 120, first, "lock")
    owner = rank_pids(run)[0]

    second = train(2, small_run(tmp_path, tiny_model_dir, steps=500, seed=1), timeout=120)
    output = second.stdout + second.stderr
    assert second.returncode == EXIT_USER_ERROR, output
    one_message(output, f"is in use by another agentrl run (pid {owner} on host")
    assert len(output.strip().splitlines()) == 1, output
    assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == 0  # the first run's folder is untouched

    os.killpg(first.pid, signal.SIGTERM)  # a terminal's or SLURM's TERM: graceful stop, and the lock goes
    out, err = finish(first, 90, "the first run after SIGTERM")
    assert first.returncode == EXIT_STOPPED, out + err[-4000:]
    assert not (run / ".lock").exists()


def test_resume_skips_a_damaged_checkpoint_and_refuses_when_none_is_complete(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    assert_ok(train(2, small_run(tmp_path, tiny_model_dir, steps=4, **{"checkpoint.every": 2})))
    spare = tmp_path / "spare"
    shutil.copytree(run, spare)
    newest = checkpoint.step_path(run, 4) / "model.safetensors"
    with newest.open("r+b") as handle:
        handle.truncate(newest.stat().st_size // 2)

    result = train(2, small_run(tmp_path, tiny_model_dir, steps=6, resume="true", **{"checkpoint.every": 2}))
    assert_ok(result)
    assert f"skipping damaged checkpoint {checkpoint.step_path(run, 4)}: model.safetensors is" in result.stdout
    assert f"resuming from {checkpoint.step_path(run, 2)} at step 2" in result.stdout
    assert "agentrl: finished: 6/6 steps in" in result.stdout and "resumed at step 2" in result.stdout
    logged = scalars(run)
    for tag in ("episode/count", "train/loss", "run/restarts"):
        assert sorted(step for step, _ in logged[tag]) == list(range(6)), tag  # steps 2-3 redone, shown once
    assert checkpoint.latest(run)[0] == 6

    # Every checkpoint damaged: refuse, and change nothing (before, resume started at 0 and pruned them).
    for step in (2, 4):
        (checkpoint.step_path(spare, step) / checkpoint.STATE_FILE).write_bytes(b"cut short")
    before = sorted((p.relative_to(spare), p.stat().st_size) for p in spare.rglob("*") if p.is_file())
    overrides = small_run(tmp_path, tiny_model_dir, steps=6, resume="true", run_dir=spare)
    refused = train(2, overrides)
    output = refused.stdout + refused.stderr
    assert refused.returncode == EXIT_USER_ERROR, output
    one_message(output, "resume=true, but none of the 2 checkpoint folder(s)")
    assert "step_000004: trainer_state.pt is 9 bytes" in output and "Nothing was changed" in output
    assert sorted((p.relative_to(spare), p.stat().st_size) for p in spare.rglob("*") if p.is_file()) == before


@pytest.mark.parametrize("rank, role", [(1, "rollout"), (2, "env")])
def test_sigterm_to_one_rank_stops_the_job(tmp_path, tiny_model_dir, rank, role):
    run = tmp_path / "run"
    process = start_training(3, small_run(tmp_path, tiny_model_dir, **LONG_RUN))
    wait_for(lambda: checkpoint.latest(run) is not None, 120, process)
    os.kill(rank_pids(run)[rank], signal.SIGTERM)
    out, err = finish(process, 60, f"the job after SIGTERM to its {role} rank")
    assert process.returncode == EXIT_STOPPED, out + err[-4000:]
    stopped_at = checkpoint.latest(run)[0]
    assert f"agentrl: SIGTERM on rank {rank}: stopping after step {stopped_at} with a checkpoint" in out
    assert f"stopped by signal at step {stopped_at}, checkpoint written (SIGTERM on rank {rank})" in out
    assert "continue      mpirun -n 3 agentrl train" in out and "resume=true" in out
    assert sorted(step for step, _ in scalars(run)["episode/count"]) == list(range(stopped_at))


def test_ctrl_c_stops_at_the_step_boundary_with_a_checkpoint(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    process = start_training(3, small_run(tmp_path, tiny_model_dir, **LONG_RUN))
    wait_for(lambda: checkpoint.latest(run) is not None, 120, process)
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the foreground process group
    out, err = finish(process, 60, "the job after Ctrl-C")
    assert process.returncode == EXIT_STOPPED, out + err[-4000:]
    one_message(err, "agentrl: Ctrl-C: stopping at the end of this step with a checkpoint")
    stopped_at = checkpoint.latest(run)[0]
    assert f"stopped by signal at step {stopped_at}, checkpoint written (SIGINT)" in out


def test_a_second_ctrl_c_stops_at_once(tmp_path, tiny_model_dir):
    """One process (no launcher in between): the first SIGINT asks for a stop, the second ends the run now."""
    run = tmp_path / "run"
    slow_steps = {"rollout.tasks_per_step": 32, "rollout.group_size": 8}  # the second press lands mid-step
    overrides = small_run(tmp_path, tiny_model_dir, steps=500, **{"layout.env": 0, "checkpoint.every": 1}, **slow_steps)
    process = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "train", QUICKSTART, *overrides],
        cwd=ROOT,
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for(lambda: checkpoint.latest(run) is not None, 120, process)
    os.killpg(process.pid, signal.SIGINT)
    time.sleep(0.1)  # two signals at the same instant would arrive as one
    pressed = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    out, err = finish(process, 30, "the run after two Ctrl-C")
    assert time.monotonic() - pressed < 10
    assert process.returncode == EXIT_INTERRUPTED, out + err[-4000:]
    one_message(err, "agentrl: interrupted again: stopped at once, without a checkpoint")
    assert not (run / ".lock").exists()


@pytest.mark.parametrize(
    "case, n, extra, message",
    [
        ("yaml", 4, ["steps=[1"], "agentrl: override 'steps=[1' is not valid YAML"),
        ("layout", 3, [], "agentrl: layout needs 2 ranks (trainer=1 + rollout=1 + env=0) but the job has 3"),
        ("model", 2, ["model.path=no/such/model", "model.tiny=null"], "agentrl: model.path=no/such/model does not"),
    ],
)
def test_user_errors_print_one_message_from_rank_0(tmp_path, tiny_model_dir, case, n, extra, message):
    result = train(n, [*small_run(tmp_path, tiny_model_dir), *extra], timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_USER_ERROR, output
    one_message(output, message)
    assert output.count("agentrl") == 1, output  # nothing else printed, on any rank
