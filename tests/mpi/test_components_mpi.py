"""Distributed pieces under real mpirun: trainer replicas, weight sync, trajectory transport, abort."""

import re
import time

import pytest

from tests.mpi.helpers import assert_ok, script

pytestmark = pytest.mark.mpi


# One per family: group baselines (grpo, rloo; dr_grpo's sequence-count normaliser), batch-normalised
# REINFORCE++ (statistics over both ranks), a sequence-level ratio (gspo) and a detached IS weight (cispo).
REPLICA_ALGORITHMS = ("grpo", "rloo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline", "gspo", "cispo")


def test_trainer_replicas_stay_identical(tiny_model_dir):
    result = script(2, "replicas.py", str(tiny_model_dir), *REPLICA_ALGORITHMS, timeout=240)
    assert_ok(result)
    for algorithm in REPLICA_ALGORITHMS:
        assert f"{algorithm}: replicas identical and equal to whole-batch training (sums over MPI)" in result.stdout
    assert "grpo: replicas identical and equal to whole-batch training (sums over torch.distributed)" in result.stdout
    assert "grpo: bfloat16 replicas identical (sums over MPI)" in result.stdout


def test_rollout_ranks_hold_the_trainers_version(tiny_model_dir):
    result = script(3, "weight_sync.py", str(tiny_model_dir))
    assert_ok(result)
    assert result.stdout.count("holds version 2 weights") == 3


def test_trajectories_arrive_exactly(tiny_model_dir):
    result = script(2, "trajectory_roundtrip.py", str(tiny_model_dir))
    assert_ok(result)
    assert "episodes arrived exactly" in result.stdout


def test_a_rank_waiting_for_a_late_one_sleeps_instead_of_spinning(tiny_model_dir):
    """At the layout's start and at the first shared-memory weight sync (rank 1 is 2 s late to each)."""
    result = script(2, "late_rank.py", str(tiny_model_dir))
    assert_ok(result)
    shares = [float(share) for share in re.findall(r"rank 0 used ([0-9.]+) of a core", result.stdout)]
    assert len(shares) == 2 and max(shares) < 0.3, result.stdout  # a blocking MPI wait used 0.5 to 1


def test_a_rank_late_to_a_collective_rings_the_ranks_waiting_in_it():
    result = script(3, "collective_ring.py", timeout=120)
    assert_ok(result)
    for what in ("allreduce", "broadcast"):
        late = float(re.search(rf"{what}: rank 0 out ([0-9.]+) s after", result.stdout).group(1))
        assert late < 0.3, result.stdout  # polled alone: 2.3 s (sleeps doubling from 50 us)


def test_exception_on_one_rank_aborts_all():
    started = time.monotonic()
    result = script(3, "raise_on_one_rank.py", timeout=60)
    assert result.returncode != 0
    assert "injected failure on rank 2" in result.stderr
    assert time.monotonic() - started < 30


def test_trainer_ranks_skip_a_nonfinite_update_alike(tiny_model_dir):
    """Only one rank sees the NaN loss (or the inf gradient); both skip, keep their state and stop together."""
    result = script(2, "nonfinite_ranks.py", str(tiny_model_dir), timeout=240)
    assert_ok(result)
    for mode in ("replicas", "fsdp"):
        assert f"{mode}: both ranks skipped alike, kept their state and stopped alike" in result.stdout
