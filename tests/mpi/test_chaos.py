"""Chaos: `kill -9` of a random rank at a random moment, three times, under `launch/mpirun.sh --max-restarts 3`.

The run must still end at its step count, with every step shown exactly once in
TensorBoard and a final checkpoint that loads. Seeded, so a failure replays.
"""

import contextlib
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from agentrl.models.loading import load_causal_lm
from agentrl.trainer import checkpoint
from tests.conftest import ROOT, mpirun_command
from tests.mpi.helpers import QUICKSTART, agentrl_on_path, job_env, job_pids, rank_pids, scalars, small_run

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(300)]

SEED = 2024
STEPS = 40
KILLS = 3
RANKS = 3
TIME_LIMIT_S = 200  # the whole run, kills and restarts included


class Chaos:
    def __init__(self, tmp_path: Path, model_dir: Path):
        self.run = tmp_path / "run"
        self.log = tmp_path / "job.log"
        overrides = small_run(
            tmp_path,
            model_dir,
            steps=STEPS,
            **{"layout.trainer": 1, "layout.rollout": 1, "layout.env": 1, "checkpoint.every": 2},
        )
        env = {
            **job_env(),
            "PATH": agentrl_on_path(tmp_path / "bin"),  # `agentrl` of this venv
            "MPIRUN": mpirun_command(RANKS)[0],
            "AGENTRL_RESTART_BACKOFF_S": "0.5",
        }
        command = ["bash", "launch/mpirun.sh", "--max-restarts", str(KILLS), str(RANKS), QUICKSTART, *overrides]
        with self.log.open("w") as out:
            self.job = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.deadline = time.monotonic() + TIME_LIMIT_S

    def newest_step(self) -> int:
        found = checkpoint.latest(self.run)
        return found[0] if found else 0

    def wait_for_progress(self, past: int) -> int:
        """Wait until a checkpoint newer than step `past` exists (the current start is training); return its step."""
        while (step := self.newest_step()) <= past:
            self.check_alive(f"a checkpoint past step {past}")
            time.sleep(0.1)
        return step

    def wait_for_ranks(self) -> dict[int, int]:
        """{rank: pid} once every rank of the current start is up (a restarted job may still be launching)."""
        while len(ranks := rank_pids(self.run)) < RANKS:
            self.check_alive(f"{RANKS} live ranks (found {ranks})")
            time.sleep(0.05)
        return ranks

    def check_alive(self, waiting_for: str) -> None:
        if self.job.poll() is not None:
            self.fail(f"the job ended ({self.job.returncode}) while waiting for {waiting_for}")
        if time.monotonic() > self.deadline:
            self.fail(f"over {TIME_LIMIT_S} s, waiting for {waiting_for}")

    def fail(self, why: str) -> None:
        self.kill_everything()
        pytest.fail(f"{why}\n{self.log.read_text()[-6000:]}")

    def kill_everything(self) -> None:
        self.job.kill()  # the supervisor; its mpirun runs in a session of its own
        for pid in job_pids(self.run):
            with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
                os.kill(pid, signal.SIGKILL)
        self.job.wait()


def expected_restarts(log: str) -> list[int]:
    """The restart count each step should show: that of the last job to start at or before the step.

    A job killed while starting logs nothing; one that resumes at STEPS (the kill landed after the
    final step) logs nothing either.
    """
    started = [(0, 0)]  # (restart count, first step) of each job that got as far as resuming
    restart = 0
    for line in log.splitlines():
        if found := re.search(r"agentrl supervise: restart (\d+)/", line):
            restart = int(found[1])
        elif found := re.search(r"agentrl: resuming from .* at step (\d+)", line):
            started.append((restart, int(found[1])))
    return [[count for count, first in started if first <= step][-1] for step in range(STEPS)]


def test_three_random_kills_and_the_run_still_ends_right(tmp_path, tiny_model_dir):
    rng = random.Random(SEED)
    chaos = Chaos(tmp_path, tiny_model_dir)
    started = time.monotonic()
    progress = 0
    killed = []
    for _ in range(KILLS):
        progress = chaos.wait_for_progress(progress)
        if progress > STEPS - 16:  # a quiet machine runs about 3 steps a second: keep the last kill mid-run
            chaos.fail(f"the run got to step {progress} before kill {len(killed) + 1}: raise STEPS")
        time.sleep(rng.uniform(0.0, 2.0))  # anywhere in a step: generating, training, syncing, checkpointing
        ranks = chaos.wait_for_ranks()
        victim = rng.randrange(RANKS)
        os.kill(ranks[victim], signal.SIGKILL)
        killed.append((victim, progress))
    try:
        chaos.job.wait(timeout=max(1.0, chaos.deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        chaos.fail("the job did not finish after the last kill")
    took = time.monotonic() - started
    log = chaos.log.read_text()
    print(f"\nchaos: killed (rank, newest checkpoint step) {killed}; finished in {took:.0f} s")
    assert chaos.job.returncode == 0, log[-6000:]
    assert [f"restart {n}/{KILLS}" in log for n in range(1, KILLS + 1)] == [True] * KILLS, log[-6000:]
    assert f"agentrl: finished: {STEPS}/{STEPS} steps" in log, log[-6000:]

    logged = scalars(chaos.run)
    for tag in ("episode/count", "episode/reward_mean", "train/loss", "time/step", "run/restarts"):
        steps = sorted(step for step, _ in logged[tag])
        assert steps == list(range(STEPS)), f"{tag}: {steps}"  # none lost, none twice
    restarts_by_step = [restarts for _, restarts in sorted(logged["run/restarts"])]
    assert restarts_by_step == expected_restarts(log), log[-6000:]

    step, path = checkpoint.latest(chaos.run)
    assert step == STEPS
    model = load_causal_lm(str(path))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    assert checkpoint.load_state(path, optimizer, scheduler, model) == STEPS
    assert not (chaos.run / ".lock").exists()
