"""runtime.peer_timeout_s with real MPI: a silent node leader ends the job; busy ones do not."""

import re
import time

import pytest

from tests.mpi.helpers import script

pytestmark = pytest.mark.mpi


def test_a_silent_node_leader_ends_the_job_within_the_timeout():
    started = time.monotonic()
    result = script(2, "liveness.py", "silent", "1.5", timeout=40)
    took = time.monotonic() - started
    assert result.returncode != 0, result.stdout + result.stderr
    assert "nothing heard from node 1 (its first rank, 1) for 1." in result.stderr, result.stderr
    assert "presumed lost" in result.stderr
    assert took < 20, f"the job took {took:.1f} s to end"  # the rank sleeps 60 s: the abort ended it


def test_busy_leaders_keep_beating_and_stop_cleanly():
    result = script(2, "liveness.py", "busy", "1.0", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # mpirun may interleave the two ranks' lines, so count each rank's words rather than whole lines
    assert sorted(re.findall(r"rank \d stopped cleanly", result.stdout)) == [
        "rank 0 stopped cleanly",
        "rank 1 stopped cleanly",
    ], result.stdout
