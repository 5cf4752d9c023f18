"""What the benchmarks that train share: the envs they train on, running a training command, reading its scalars."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np

from agentrl.sweep.objective import read_scalars as scalars  # noqa: F401 (what the benchmarks import from here)

REPO = Path(__file__).resolve().parents[1]
ENVS = {  # name -> (config, ranks)
    "quickstart": ("launch/configs/quickstart.yaml", 4),
    "frozen_lake": ("launch/configs/frozen_lake.yaml", 3),
}


def window_means(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Mean over the first 2% of steps (at least one) and over the last 10%."""
    values = np.array([v for _, v in points])
    if not len(values):
        return float("nan"), float("nan")
    head = max(1, round(0.02 * len(values)))
    tail = max(1, round(0.10 * len(values)))
    return float(values[:head].mean()), float(values[-tail:].mean())


def run_or_exit(command: list[str], run_dir: Path, what: str, env: dict | None = None) -> float:
    """Run a training command from the repository root; its wall seconds, or exit naming the log of a failure."""
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True)
    if result.returncode:
        log = run_dir.with_suffix(".log")
        log.write_bytes(result.stdout + result.stderr)
        raise SystemExit(f"{what} failed (exit {result.returncode}); see {log}")
    return time.perf_counter() - started
