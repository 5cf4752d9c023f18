"""A trial's objective read from real TensorBoard event files: last, mean over the last fraction, max, and a resumed
run's redone steps counted once."""

from __future__ import annotations

import math

import pytest

from agentrl.sweep.objective import last_step, read_scalars, reduce, score, window_means
from agentrl.sweep.spec import Objective


def write(run_dir, points, tag="episode/success_rate", purge_step=None):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)
    for step, value in points:
        writer.add_scalar(tag, value, step)
        writer.add_scalar("run/restarts", 0, step)
    writer.close()


def test_reductions_of_a_training_scalar(tmp_path):
    write(tmp_path, [(step, step / 10) for step in range(20)])
    objective = Objective(scalar="episode/success_rate", reduce="mean_last", fraction=0.1)
    assert score(tmp_path, objective, total_steps=20) == pytest.approx((1.8 + 1.9) / 2)
    assert score(tmp_path, objective.model_copy(update={"reduce": "last"}), 20) == pytest.approx(1.9)
    assert score(tmp_path, objective.model_copy(update={"reduce": "min"}), 20) == pytest.approx(0.0)
    assert score(tmp_path, objective, total_steps=20, up_to=9) == pytest.approx((0.8 + 0.9) / 2)
    assert score(tmp_path, Objective(scalar="eval/success"), 20) is None  # never logged
    assert last_step(tmp_path) == 19


def test_a_resumed_run_counts_each_step_once(tmp_path):
    write(tmp_path, [(step, 0.0) for step in range(6)])
    write(tmp_path, [(step, 1.0) for step in range(4, 8)], purge_step=4)  # resumed from the checkpoint of step 4
    points = read_scalars(tmp_path, "episode/success_rate")
    assert [step for step, _ in points] == list(range(8))
    assert [value for _, value in points] == [0.0] * 4 + [1.0] * 4
    assert reduce(points, Objective(scalar="x", reduce="mean_last", fraction=0.5), total_steps=8) == 1.0


def test_window_means_are_the_first_2_percent_and_the_last_10_percent():
    """Where a run started and ended, as the learning table and the benchmarks report it (at least one point each)."""
    points = [(step, float(step)) for step in range(200)]
    assert window_means(points) == (pytest.approx((0 + 1 + 2 + 3) / 4), pytest.approx(sum(range(180, 200)) / 20))
    assert window_means([(0, 0.25), (1, 0.75)]) == (0.25, 0.75)
    assert all(math.isnan(mean) for mean in window_means([]))  # no points, no means
