"""Under mpirun: the process-group weight broadcast (NCCL code path, gloo on CPU); SGLang crash handling."""

import time

from tests.mpi.helpers import assert_ok, script


def test_gloo_broadcast_reaches_every_engine_exactly(tiny_model_dir):
    result = script(3, "weight_sync_dist.py", str(tiny_model_dir), timeout=180)
    assert_ok(result)
    assert result.stdout.count("holds version 2 weights") == 3


def test_sglang_child_crash_aborts_the_job_instead_of_hanging():
    started = time.monotonic()
    result = script(2, "sglang_child_crash.py", timeout=60)
    assert result.returncode != 0
    assert "SGLang subprocess" in result.stderr and "passed the barrier" not in result.stdout
    assert time.monotonic() - started < 40
