"""tools/learning_table.py's per-trial numbers: the training time to the target survives a paused trial."""

import importlib.util

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def learning_table():
    spec = importlib.util.spec_from_file_location("learning_table", ROOT / "tools" / "learning_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_minutes_counts_a_paused_step_at_the_stall_cap(learning_table):
    steps = [(s, 0.5) for s in range(100)]
    assert learning_table.training_minutes(steps, 59) == pytest.approx(60 * 0.5 / 60)
    paused = [(s, 2153.0 if s == 30 else v) for s, v in steps]  # a sweep stopped for 36 minutes during step 30
    capped = learning_table.STALL_FACTOR * 0.5
    assert learning_table.training_minutes(paused, 59) == pytest.approx((59 * 0.5 + capped) / 60)
    assert learning_table.training_minutes(paused, 29) == pytest.approx(30 * 0.5 / 60)  # before the pause
    slow = [(s, 0.5 if s < 50 else 1.5) for s in range(100)]  # a slower second half is training, not a stall
    assert learning_table.training_minutes(slow, 99) == pytest.approx((50 * 0.5 + 50 * 1.5) / 60)


def test_steps_to_is_the_first_step_whose_trailing_mean_reaches_the_target(learning_table):
    points = [(s, 0.0 if s < 100 else 1.0) for s in range(200)]
    assert learning_table.steps_to(points, 0.8, window=50) == 139  # 40 of the last 50 at 1.0
    assert learning_table.steps_to(points[:120], 0.8, window=50) is None
