"""benchmarks/gpu_check.py stays runnable without a GPU: its CPU dry run goes through every step but CUDA IPC."""

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_gpu_check_dry_run_on_cpu_prints_its_table():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--batch-sizes", "4"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = dict(re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", result.stdout, flags=re.MULTILINE))
    assert rows["engine weight version after update"] == "2"
    max_diff = float(re.search(r"max ([0-9.e+-]+)", rows["engine vs trainer logprobs, abs diff"]).group(1))
    assert max_diff < 1e-4  # the engine samples with exactly the trainer's updated weights
    assert "engine" in rows["tokens/s at batch 4 (8 new)"] and "generate" in rows["tokens/s at batch 4 (8 new)"]


def test_gpu_check_without_cuda_says_how_to_dry_run():
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the script runs for real")
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--device cpu" in result.stdout + result.stderr
