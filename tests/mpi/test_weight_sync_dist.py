"""Under mpirun: the process-group weight broadcast (NCCL code path, gloo on CPU); SGLang crash handling."""

import time

from tests.mpi.helpers import TRANSPORT_COMPARISON, assert_ok, scalars, script, small_run, train


def test_gloo_broadcast_reaches_every_engine_exactly(tiny_model_dir):
    result = script(3, "weight_sync_dist.py", str(tiny_model_dir), timeout=180)
    assert_ok(result)
    assert result.stdout.count("holds version 2 weights") == 3


def test_training_with_the_process_group_sync_matches_the_mpi_sync(tmp_path, tiny_model_dir, mpi_sync_reference):
    """`agentrl train` with weights.transport=gloo (2 rollout ranks join lazily) trains exactly like the MPI path."""
    assert_ok(train(3, small_run(tmp_path, tiny_model_dir, **TRANSPORT_COMPARISON, **{"weights.transport": "gloo"})))
    runs = {"gloo": scalars(tmp_path / "run"), "mpi": mpi_sync_reference}
    assert all(v < 1e-4 for _, v in runs["gloo"]["train/logprob_diff_vs_rollout"])
    assert all(v == 0 for _, v in runs["gloo"]["episode/weight_lag_mean"])
    for metric in ("episode/reward_mean", "train/loss"):  # same seeds, same weights: the same run
        assert runs["gloo"][metric] == runs["mpi"][metric]


def test_sglang_child_crash_aborts_the_job_instead_of_hanging():
    started = time.monotonic()
    result = script(2, "sglang_child_crash.py", timeout=60)
    assert result.returncode != 0
    assert "SGLang subprocess" in result.stderr and "passed the barrier" not in result.stdout
    assert time.monotonic() - started < 40
