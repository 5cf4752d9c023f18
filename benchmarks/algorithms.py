"""The learning table: every registered algorithm on the same envs, seeds and step budget.

    python benchmarks/algorithms.py                               # all algorithms, quickstart + frozen_lake
    python benchmarks/algorithms.py --algorithms grpo rloo --envs quickstart --steps 400 --seeds 0 1

Each run is `mpirun -n N agentrl train CONFIG algorithm.name=NAME seed=S steps=K` in its own
run_dir under --out; runs go one after another (the ranks of one run already fill the cores).
Printed per run, from its TensorBoard events: the policy's success rate (`rollout/success_rate`)
over the first 2% of steps (at least one) and over the last 10%, the first step whose trailing
50-step mean reaches 0.8 and the wall time to it, the wall time of the whole command, the median
step time relative to grpo's, and for algorithms that log it, explained variance at the start and end. A markdown
table follows, ready for the README.

Each finished row is appended to OUT/results.jsonl; `--resume` skips the runs already there,
so a long table can be produced over several sittings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ENVS = {  # name -> (config, ranks)
    "quickstart": ("launch/configs/quickstart.yaml", 4),
    "frozen_lake": ("launch/configs/frozen_lake.yaml", 3),
}


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[int, float] = {}
    for events in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            points.update((e.step, e.value) for e in accumulator.Scalars(tag))
    return sorted(points.items())


def window_means(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Mean over the first 2% of steps (at least one) and over the last 10%."""
    values = np.array([v for _, v in points])
    if not len(values):
        return float("nan"), float("nan")
    head = max(1, round(0.02 * len(values)))
    tail = max(1, round(0.10 * len(values)))
    return float(values[:head].mean()), float(values[-tail:].mean())


def steps_to(points: list[tuple[int, float]], target: float = 0.8, window: int = 50) -> int | None:
    """The first step at which the mean of the last `window` points reaches `target` (None: never)."""
    values = np.array([v for _, v in points])
    if len(values) < window:
        return None
    trailing = np.convolve(values, np.ones(window) / window, mode="valid")
    hits = np.flatnonzero(trailing >= target)
    return int(points[hits[0] + window - 1][0]) if len(hits) else None


def wall_at(run_dir: Path, step: int) -> float | None:
    """Training seconds up to the end of `step`: TensorBoard wall times from the first step's event,
    plus that first step's own duration (`time/step`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = {}
    for path in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        if "time/step" in accumulator.Tags()["scalars"]:
            events.update((e.step, e) for e in accumulator.Scalars("time/step"))
    if step not in events:
        return None
    first = events[min(events)]
    return events[step].wall_time - first.wall_time + first.value


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


def run(algorithm: str, env: str, seed: int, steps: int, out: Path, extra: list[str]) -> dict:
    config, ranks = ENVS[env]
    run_dir = out / f"{env}-{algorithm}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        "mpirun", "-n", str(ranks), "agentrl", "train", config,
        f"algorithm.name={algorithm}", f"seed={seed}", f"steps={steps}", f"run_dir={run_dir}",
        "logging.progress=false", "checkpoint.every=0", *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
    wall = time.perf_counter() - started
    row = {
        "algorithm": algorithm,
        "env": env,
        "seed": seed,
        "steps": steps,
        "wall_s": wall,
        "ok": result.returncode == 0,
    }
    if not row["ok"]:
        (out / f"{run_dir.name}.log").write_bytes(result.stdout + result.stderr)
        return row
    return summarize(row, run_dir)


def summarize(row: dict, run_dir: Path) -> dict:
    """The row's learning numbers from the run's TensorBoard events.

    Success is `rollout/success_rate`, the policy's own over each step's first round of tasks: the
    trained batch's `episode/success_rate` leaves out the groups dynamic sampling dropped (dapo drops
    every group once the policy answers each task the same way, and would read 0)."""
    success = scalars(run_dir, "rollout/success_rate") or scalars(run_dir, "episode/success_rate")
    row["start"], row["end"] = window_means(success)
    row["steps_to_0.8"] = steps_to(success)
    row["wall_to_0.8_s"] = wall_at(run_dir, row["steps_to_0.8"]) if row["steps_to_0.8"] is not None else None
    row["step_s"] = float(np.median([v for _, v in scalars(run_dir, "time/step")]))
    variance = scalars(run_dir, "train/explained_variance")
    row["ev_start"], row["ev_end"] = window_means(variance) if variance else (None, None)
    return row


def main() -> int:
    from agentrl.algorithms.registry import registered_names
    from agentrl.config import load_config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="*", default=None, help="default: every registered name")
    parser.add_argument("--envs", nargs="*", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--steps", type=int, default=None, help="default: the config's own steps")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--out", type=Path, default=Path("runs/algorithms"))
    parser.add_argument("--resume", action="store_true", help="skip runs already in OUT/results.jsonl")
    parser.add_argument("overrides", nargs="*", help="key=value added to every run")
    args = parser.parse_args()
    algorithms = args.algorithms or registered_names()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    done = [json.loads(line) for line in results.read_text().splitlines()] if args.resume and results.exists() else []
    rows = []
    for env in args.envs:
        for algorithm in algorithms:
            for seed in args.seeds:
                steps = args.steps or load_config(REPO / ENVS[env][0]).steps
                key = (algorithm, env, seed, steps)
                previous = [r for r in done if (r["algorithm"], r["env"], r["seed"], r["steps"]) == key]
                if previous:
                    row = previous[-1]
                    run_dir = args.out / f"{env}-{algorithm}-seed{seed}"
                    if row["ok"] and run_dir.is_dir():
                        row = summarize(row, run_dir)  # read again: how rows are summarized may have changed
                else:
                    row = run(algorithm, env, seed, steps, args.out, args.overrides)
                    with results.open("a") as out:
                        out.write(json.dumps(row) + "\n")
                rows.append(row)
                print(format_row(row, rows), flush=True)
    print("\n| env | algorithm | seed | steps | success start -> end | steps (wall) to 0.8 | wall | step vs grpo |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(markdown_row(row, rows))
    return 0 if all(row["ok"] for row in rows) else 1


def relative_step(row: dict, rows: list[dict]) -> float | None:
    base = [r["step_s"] for r in rows if r["ok"] and r["env"] == row["env"] and r["algorithm"] == "grpo"]
    return row["step_s"] / float(np.median(base)) if base and row.get("step_s") else None


def format_row(row: dict, rows: list[dict]) -> str:
    head = f"{row['env']:<12} {row['algorithm']:<22} seed {row['seed']}"
    if not row["ok"]:
        return f"{head}  FAILED after {row['wall_s']:.0f} s (log beside the run dirs)"
    ratio = relative_step(row, rows)
    text = f"{head}  success {row['start']:.2f} -> {row['end']:.2f}  wall {row['wall_s']:.0f} s"
    text += f"  step {row['step_s']:.3f} s" + (f" ({ratio:.2f}x grpo)" if ratio else "")
    if row.get("ev_start") is not None:
        text += f"  explained variance {row['ev_start']:.2f} -> {row['ev_end']:.2f}"
    return text


def markdown_row(row: dict, rows: list[dict]) -> str:
    if not row["ok"]:
        return f"| {row['env']} | {row['algorithm']} | {row['seed']} | {row['steps']} | failed | | | |"
    ratio = relative_step(row, rows)
    reached = row.get("steps_to_0.8")
    to_target = f"{reached} ({row['wall_to_0.8_s'] / 60:.1f} min)" if reached is not None else "not reached"
    return (
        f"| {row['env']} | {row['algorithm']} | {row['seed']} | {row['steps']} | "
        f"{row['start']:.2f} -> {row['end']:.2f} | {to_target} | {row['wall_s'] / 60:.1f} min | "
        f"{f'{ratio:.2f}x' if ratio else ''} |"
    )


if __name__ == "__main__":
    sys.exit(main())
