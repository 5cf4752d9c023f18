"""What the benchmarks that train share: their envs, running a training command, its scalars (agentrl.sweep's)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from agentrl.sweep.objective import read_scalars as scalars  # noqa: F401 (what the benchmarks import from here)
from agentrl.sweep.objective import window_means  # noqa: F401 (likewise)

REPO = Path(__file__).resolve().parents[1]
ENVS = {  # name -> (config, ranks)
    "quickstart": ("launch/configs/quickstart.yaml", 4),
    "frozen_lake": ("launch/configs/frozen_lake.yaml", 3),
}


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
