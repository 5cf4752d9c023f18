"""Claims on a sweep's trials: a runner alive on this host keeps its trial however stale its heartbeat; a runner on
another host whose heartbeat is old has lost it, and the trial is taken again (its training gone)."""

from __future__ import annotations

import time

import pytest

from agentrl.sweep.spec import load_spec
from agentrl.sweep.study import STALE_S, Sweep
from tests.unit.test_sweep_local import write_spec


@pytest.fixture
def claimed(tmp_path, tiny_model_dir):
    """A sweep with one trial claimed by this process, its heartbeat older than STALE_S."""
    sweep = Sweep(load_spec(write_spec(tmp_path, tiny_model_dir, trials=2)))
    sweep.create_or_check(resume=False)
    study = sweep.study()
    claim = sweep.claim_next(study)
    record = sweep.read_runner(claim.number)
    sweep.write_runner(claim.number, {**record, "heartbeat": time.time() - 10 * STALE_S})
    return sweep, study, claim


def test_a_live_runner_on_this_host_keeps_its_trial_through_a_slow_minute(claimed):
    sweep, study, claim = claimed
    assert sweep.runner_alive(claim.number)
    again = sweep.claim_next(study)
    assert again is not None and again.number != claim.number and again.attempt == 1  # a new trial, not this one


def test_a_silent_runner_on_another_host_loses_its_trial(claimed):
    sweep, study, claim = claimed
    record = sweep.read_runner(claim.number)
    sweep.write_runner(claim.number, {**record, "host": "another-node"})
    assert not sweep.runner_alive(claim.number)
    again = sweep.claim_next(study)
    assert (again.number, again.attempt) == (claim.number, 2)  # resumed, not lost, not run beside itself
    sweep.write_runner(claim.number, {**sweep.read_runner(claim.number), "host": "another-node"})
    sweep.write_runner(claim.number, {**sweep.read_runner(claim.number), "heartbeat": time.time()})
    assert sweep.runner_alive(claim.number)  # a fresh heartbeat from there: still its
