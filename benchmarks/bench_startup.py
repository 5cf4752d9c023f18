"""Start-up CPU: one model rank's, and a whole `mpirun -n 4` quickstart job's.

    python benchmarks/bench_startup.py [--repeats 5] [--against DIR ...]

1. A model rank's start-up in a fresh process: import torch and transformers, load the tiny model and its
   tokenizer with `from_pretrained`. Once at CPython's default collector thresholds, once the way `agentrl`
   starts (agentrl.run.startup_gc: defer_collection, then settle). The two alternate; medians of --repeats.
2. With --against DIR ... (other checkouts, e.g. `git worktree add /tmp/old HEAD~3`): a one-step
   `mpirun -n 4 agentrl train launch/configs/quickstart.yaml` from this checkout and from each DIR, in turn:
   wall time and the CPU all ranks used together.

Run it on a quiet machine; the medians and their ratio are what to quote.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RANK_START = """
import sys, time
wall, cpu = time.perf_counter(), time.process_time()
if sys.argv[2] == "agentrl":
    from agentrl.run import startup_gc
    startup_gc.defer_collection()
from agentrl.models.loading import load_causal_lm, load_tokenizer
model, tokenizer = load_causal_lm(sys.argv[1]), load_tokenizer(sys.argv[1])
if sys.argv[2] == "agentrl":
    startup_gc.settle()
print(time.perf_counter() - wall, time.process_time() - cpu)
"""


def child_env(root: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root), "TRANSFORMERS_VERBOSITY": "error"}


def rank_start(model_dir: Path, collector: str) -> tuple[float, float]:
    result = subprocess.run(
        [sys.executable, "-c", RANK_START, str(model_dir), collector],
        env=child_env(ROOT),
        capture_output=True,
        text=True,
        check=True,
    )
    wall, cpu = result.stdout.split()
    return float(wall), float(cpu)


def job_start(root: Path, run_dir: Path, model_dir: Path) -> tuple[float, float]:
    """(wall s, CPU s of every rank) of a one-step quickstart under mpirun -n 4, from the checkout at `root`."""
    mpirun = Path(sys.executable).parent / "mpirun"
    overrides = ["steps=1", "eval.every=0", "checkpoint.every=0", "logging.progress=false"]
    overrides += [f"run_dir={run_dir}", f"model.path={model_dir}"]
    config = root / "launch" / "configs" / "quickstart.yaml"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run(
        [str(mpirun), "-n", "4", sys.executable, "-m", "agentrl.cli", "train", str(config), *overrides],
        cwd=root,
        env=child_env(root),
        capture_output=True,
        check=True,
    )
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """(wall, CPU) medians of (wall, CPU) samples."""
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def row(name: str, samples: list[tuple[float, float]]) -> str:
    wall, cpu = medians(samples)
    return f"| {name} | {wall:.2f} | {cpu:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", type=Path, nargs="+", help="other checkouts to compare one-step mpirun jobs with")
    args = parser.parse_args()

    from agentrl.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        build_tiny_model(model_dir, ["Guess the number between 1 and 7. higher lower correct"])
        ranks = {"default thresholds": [], "agentrl.run.startup_gc": []}
        for _ in range(args.repeats):
            ranks["default thresholds"].append(rank_start(model_dir, "default"))
            ranks["agentrl.run.startup_gc"].append(rank_start(model_dir, "agentrl"))
        print(f"One model rank's start-up (imports, tiny model and tokenizer), medians of {args.repeats}")
        print("| collector | wall s | CPU s |\n|---|---|---|")
        for name, samples in ranks.items():
            print(row(name, samples))
        ratio = medians(ranks["default thresholds"])[1] / medians(ranks["agentrl.run.startup_gc"])[1]
        print(f"CPU ratio, default/agentrl: {ratio:.2f}x")

        if args.against is not None:
            jobs = {root: [] for root in (ROOT, *(path.resolve() for path in args.against))}
            quickstart_model = Path(tmp) / "quickstart-model"
            job_start(ROOT, Path(tmp) / "warm-up", quickstart_model)  # builds the quickstart's tiny model once
            for i in range(args.repeats):
                for n, root in enumerate(jobs):
                    jobs[root].append(job_start(root, Path(tmp) / f"run-{n}-{i}", quickstart_model))
            print(f"\nmpirun -n 4 agentrl train quickstart.yaml steps=1, medians of {args.repeats}")
            print("| checkout | wall s | CPU s (all ranks) |\n|---|---|---|")
            for root, samples in jobs.items():
                print(row(str(root), samples))


if __name__ == "__main__":
    main()
