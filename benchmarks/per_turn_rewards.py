"""Per-turn returns (turn_rloo) against the episode-level baseline (rloo) on guess_number, whose length the agent sets.

    python -m benchmarks.per_turn_rewards                       # 3 seeds x 2 algorithms, one seed's pair at a time
    python -m benchmarks.per_turn_rewards --report-only         # the table again from the runs already made

Every run is the quickstart's config (launch/configs/quickstart.yaml: guess 1..7 in at most 4 guesses, a win ends the
game, `progress_reward` pays each wrong guess by the share of numbers it rules out) in one process, with only
`algorithm.name` and `seed` differing between runs. The two algorithms of one seed run side by side, so their wall
times share the machine alike. Writes the raw numbers to benchmarks/results/per_turn_rewards.json and prints a
markdown table: rollout success over the first 2% of steps and the last 10%, at a few points of the run (mean of 10
steps), the first step whose trailing 20-step mean reaches 0.5 and 0.8, the median step time and the wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from agentrl.sweep.objective import read_run_scalars
from benchmarks.runs import REPO, window_means

CONFIG = "launch/configs/quickstart.yaml"
TAGS = ("rollout/success_rate", "time/step", "rollout/reward_mean", "episode/turns_mean")


def command(algorithm: str, seed: int, steps: int, tasks: int, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        CONFIG,
        f"algorithm.name={algorithm}",
        f"seed={seed}",
        f"steps={steps}",
        f"run_dir={run_dir}",
        "layout={trainer: 1, rollout: 1, env: 0}",
        f"rollout.tasks_per_step={tasks}",
        "checkpoint.every=0",
        "logging.sample_every=0",
        "eval.every=0",
    ]


def run_pair(algorithms: list[str], seed: int, args, root: Path) -> dict[str, float]:
    """Train each algorithm on `seed`, all at once; the wall seconds of each."""
    started, procs = {}, {}
    for algorithm in algorithms:
        run_dir = root / f"{algorithm}-seed{seed}"
        cmd = command(algorithm, seed, args.steps, args.tasks, run_dir)
        print("$", " ".join(cmd[2:]), flush=True)
        started[algorithm] = time.perf_counter()
        with open(run_dir.with_suffix(".log"), "wb") as log:  # the child keeps its own copy of the descriptor
            procs[algorithm] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    walls = {}
    for algorithm, proc in procs.items():
        if proc.wait():
            raise SystemExit(f"{algorithm} seed {seed} failed (exit {proc.returncode}); see its .log in {root}")
        walls[algorithm] = time.perf_counter() - started[algorithm]
    return walls


def first_reaching(values: np.ndarray, level: float, window: int = 20) -> int | None:
    """The first step whose trailing `window`-step mean reaches `level` (None: never)."""
    for end in range(window, len(values) + 1):
        if values[end - window : end].mean() >= level:
            return end - 1
    return None


def summarise(run_dir: Path, wall: float | None, points: list[int]) -> dict:
    scalars = read_run_scalars(run_dir, list(TAGS))
    success = np.array([v for _, v in scalars.get("rollout/success_rate", [])])
    start, end = window_means(scalars.get("rollout/success_rate", []))
    step_time = np.array([v for _, v in scalars.get("time/step", [])])
    turns = np.array([v for _, v in scalars.get("episode/turns_mean", [])])
    return {
        "steps": len(success),
        "success_start": start,
        "success_end": end,
        "success_at": {p: float(success[max(0, p - 10) : p].mean()) for p in points if p <= len(success)},
        "step_to_0.5": first_reaching(success, 0.5),
        "step_to_0.8": first_reaching(success, 0.8),
        "turns_start_end": window_means(list(enumerate(turns))) if len(turns) else None,
        "step_s_median": float(np.median(step_time)) if len(step_time) else None,
        "wall_s": wall,
        "success_curve": success.round(4).tolist(),
    }


def table(results: dict, points: list[int]) -> str:
    head = " | ".join(f"step {p}" for p in points)
    lines = [
        f"| algorithm | seed | success start -> end | {head} | step to 0.5 | step to 0.8 | turns start -> end "
        "| step s (median) | wall min |",
        "|---|---|---|" + "---|" * len(points) + "---|---|---|---|---|",
    ]
    for name, row in sorted(results.items()):
        algorithm, seed = name.rsplit("-seed", 1)
        at = " | ".join(f"{row['success_at'].get(str(p), row['success_at'].get(p, float('nan'))):.2f}" for p in points)
        wall = f"{row['wall_s'] / 60:.1f}" if row["wall_s"] else "-"
        step_s = f"{row['step_s_median']:.2f}" if row["step_s_median"] else "-"
        turns = "{:.2f} -> {:.2f}".format(*row["turns_start_end"]) if row["turns_start_end"] else "-"
        lines.append(
            f"| {algorithm} | {seed} | {row['success_start']:.2f} -> {row['success_end']:.2f} | {at} | "
            f"{row['step_to_0.5']} | {row['step_to_0.8']} | {turns} | {step_s} | {wall} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=["rloo", "turn_rloo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--tasks", type=int, default=8, help="rollout.tasks_per_step (the quickstart's is 32)")
    parser.add_argument("--root", type=Path, default=Path("runs/per_turn_rewards"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/per_turn_rewards.json"))
    parser.add_argument("--report-only", action="store_true", help="summarise the runs in --root, train nothing")
    args = parser.parse_args()
    root = REPO / args.root
    root.mkdir(parents=True, exist_ok=True)
    out = REPO / args.out
    previous = json.loads(out.read_text()) if out.exists() else {}
    walls = {name: row.get("wall_s") for name, row in previous.get("runs", {}).items()}
    if not args.report_only:
        for seed in args.seeds:
            for algorithm, wall in run_pair(args.algorithms, seed, args, root).items():
                walls[f"{algorithm}-seed{seed}"] = wall
    points = [10, args.steps // 4, args.steps // 2, 3 * args.steps // 4, args.steps]
    results = {
        f"{a}-seed{s}": summarise(root / f"{a}-seed{s}", walls.get(f"{a}-seed{s}"), points)
        for a in args.algorithms
        for s in args.seeds
        if (root / f"{a}-seed{s}").is_dir()
    }
    settings = {"config": CONFIG, "steps": args.steps, "tasks_per_step": args.tasks, "seeds": args.seeds}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": settings, "runs": results}, indent=1) + "\n")
    print(table(json.loads(out.read_text())["runs"], points))


if __name__ == "__main__":
    main()
