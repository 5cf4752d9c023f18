"""MPIEnvClient's reply thread under real mpirun: answers reach their episodes, and a wait always ends."""

import time

import pytest

from tests.mpi.helpers import assert_ok, script

pytestmark = pytest.mark.mpi


def test_batches_in_flight_get_their_own_answers():
    result = script(2, "env_round_trip.py", "answers", timeout=120)
    assert_ok(result)
    assert result.stdout.count("every answer reached its own episode") == 2
    assert "reply thread ended at shutdown" in result.stdout


def test_doorbells_cut_polled_waits_short():
    """Each side polls every 2 s; without rings 12 round trips would take over 24 s (the first goes unrung)."""
    result = script(2, "env_round_trip.py", "rings", timeout=120)
    assert_ok(result)
    seconds = float(result.stdout.split("12 round trips in ")[1].split(" s")[0])
    assert seconds < 8.0, result.stdout


def test_an_env_rank_that_never_answers_times_the_call_out():
    result = script(2, "env_round_trip.py", "silent", timeout=120)
    assert_ok(result)
    assert "timed out waiting for env rank 1 to answer" in result.stdout


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_the_wait_ends_when_the_env_rank_is_gone(how):
    started = time.monotonic()
    result = script(2, "env_round_trip.py", how, timeout=90)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "the call returned" not in result.stdout
    assert ("injected failure on the env rank" if how == "raise" else "env rank exits") in result.stderr
    assert seconds < 60, output
