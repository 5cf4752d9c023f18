"""benchmarks/gpu_check.py stays runnable without a GPU: its CPU dry run goes through every section but CUDA IPC
(and the quickstart, which the mpi-marked test runs on its own)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
ROW = r"^\| ([^|]+?) \| ([^|]+?) \|$"


def run_gpu_check(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--small", *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_gpu_check_dry_run_on_cpu_prints_its_table(tmp_path):
    out = tmp_path / "table.md"
    result = run_gpu_check("--batch-sizes", "4", "--out", str(out))
    rows = dict(re.findall(ROW, result.stdout, flags=re.MULTILINE))
    assert not [check for check, value in rows.items() if value.startswith("FAILED")], rows
    assert rows["engine weight version after update"] == "7"  # 2 warm-up sends and 5 timed ones
    lean = rows["the trainer's lean forward"]
    apart = float(re.search(r"gradients ([0-9.e+-]+) of the largest", lean).group(1))
    assert lean.startswith("taken;") and apart < 1e-5  # the lean forward trains as the model's own
    max_diff = float(re.search(r"max ([0-9.e+-]+)", rows["engine vs trainer logprobs, abs diff"]).group(1))
    assert max_diff < 1e-4  # the engine samples with exactly the trainer's updated weights
    update = next(value for check, value in rows.items() if check.startswith("weight update ("))
    assert float(re.search(r"([0-9.]+)x one device copy", update).group(1)) > 0
    speed = rows["tokens/s at batch 4 (8 new)"]
    assert re.search(r"continuous \d+ \((no )?graphs\), batch \d+, generate \d+; continuous/generate [0-9.]+x", speed)
    multiturn = rows["multi-turn 4x2 (64x2x4, fp32)"]
    assert re.search(r"continuous \d+ .*batch \d+, generate \d+ tokens/s; continuous/generate [0-9.]+x", multiturn)
    assert not any(check.startswith("quickstart") for check in rows)  # CPU without --quickstart: not run
    assert "gpu_check wall time" in rows
    # --out holds the same table, written row by row
    assert dict(re.findall(ROW, out.read_text(), flags=re.MULTILINE)) == rows


def test_gpu_check_failed_section_is_a_row_and_the_rest_runs(tmp_path):
    """A section that fails leaves `| section | FAILED: <one line> |` (in --out too) and the next one still runs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    table, timings = gpu_check.Table(str(tmp_path / "table.md")), {}
    with gpu_check.section(table, "broken | section", timings, "broken"):
        raise ValueError("first line\nsecond line")
    with gpu_check.section(table, "skipped", timings):
        pytest.skip("mpirun not found")  # what mpirun_command raises: a BaseException, recorded as well
    with gpu_check.section(table, "next", timings):
        table.add("next", "ran")
    expected = [
        "| broken / section | FAILED: ValueError: first line |",
        "| skipped | FAILED: Skipped: mpirun not found |",
        "| next | ran |",
    ]
    assert table.rows == expected
    assert (tmp_path / "table.md").read_text() == gpu_check.Table.HEADER + "\n".join(expected) + "\n"
    assert set(timings) == {"broken", "skipped", "next"}


@pytest.mark.mpi
def test_gpu_check_quickstart_section_trains_under_mpirun():
    """The quickstart section alone (`--sections quickstart`: the rest is the test above), 2 steps on CPU."""
    result = run_gpu_check("--quickstart", "--quickstart-steps", "2", "--sections", "quickstart")
    rows = dict(re.findall(ROW, result.stdout, flags=re.MULTILINE))
    quickstart = rows["quickstart, mpirun -n 4, cpu"]
    assert re.match(r"2 steps in [0-9.]+ s, exit 0; weights: \S", quickstart), quickstart


def test_gpu_check_without_cuda_says_how_to_dry_run():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: the script runs for real")
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--device cpu" in result.stdout + result.stderr
