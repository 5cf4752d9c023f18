"""Per-turn returns (turn_rloo) against the episode-level baseline (rloo) on guess_number, whose length the agent sets.

    python -m benchmarks.per_turn_rewards --steps 100 --tasks 16          # rloo and turn_rloo, seeds 0-2, pairs
    python -m benchmarks.per_turn_rewards --steps 100 --tasks 16 --variants turn_rloo_padded --parallel 3
    python -m benchmarks.per_turn_rewards --steps 100 --tasks 16 --report-only   # the tables again from the runs

Every run is the quickstart's config (launch/configs/quickstart.yaml: guess 1..7 in at most 4 guesses, a win ends the
game, `progress_reward` pays each wrong guess by the share of numbers it rules out) in one process, with only the
variant's `algorithm` overrides (VARIANTS) and `seed` differing between runs. By default the two variants of one seed
run side by side, so their wall times share the machine alike. Writes the raw numbers to
benchmarks/results/per_turn_rewards.json (adding to the runs already there) and prints two markdown tables: per run,
rollout success over the first 2% of steps and the last 10%, at a few points of the run (mean of the 10 steps before),
the first step whose trailing 20-step mean reaches 0.5 and 0.8, episode length, median step time and wall time; per
variant, the same over its seeds.
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


VARIANTS = {  # a run's name -> its overrides
    "rloo": ["algorithm.name=rloo"],
    "turn_rloo": ["algorithm.name=turn_rloo"],
    "turn_rloo_padded": ["algorithm.name=turn_rloo", "algorithm.baseline=padded"],
}


def command(variant: str, seed: int, steps: int, tasks: int, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        CONFIG,
        *VARIANTS[variant],
        f"seed={seed}",
        f"steps={steps}",
        f"run_dir={run_dir}",
        "layout={trainer: 1, rollout: 1, env: 0}",
        f"rollout.tasks_per_step={tasks}",
        "checkpoint.every=0",
        "logging.sample_every=0",
        "eval.every=0",
    ]


def run_all(jobs: list[tuple[str, int]], args, root: Path) -> dict[str, float]:
    """Train every (variant, seed), `args.parallel` at a time in the order given; the wall seconds of each."""
    waiting, running, walls = list(jobs), {}, {}
    while waiting or running:
        while waiting and len(running) < args.parallel:
            variant, seed = waiting.pop(0)
            name = f"{variant}-seed{seed}"
            cmd = command(variant, seed, args.steps, args.tasks, root / name)
            print("$", " ".join(cmd[2:]), flush=True)
            with open((root / name).with_suffix(".log"), "wb") as log:  # the child keeps its own descriptor
                running[name] = (subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), time.time())
        time.sleep(1.0)
        for name, (proc, started) in list(running.items()):
            if proc.poll() is None:
                continue
            if proc.returncode:
                raise SystemExit(f"{name} failed (exit {proc.returncode}); see {root / name}.log")
            walls[name] = time.time() - started
            del running[name]
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
        "success_mean": float(success.mean()) if len(success) else float("nan"),  # the area under the curve
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
    by_variant: dict[str, list[dict]] = {}
    for name, row in sorted(results.items()):
        algorithm, seed = name.rsplit("-seed", 1)
        by_variant.setdefault(algorithm, []).append(row)
        at = " | ".join(f"{row['success_at'].get(str(p), row['success_at'].get(p, float('nan'))):.2f}" for p in points)
        wall = f"{row['wall_s'] / 60:.1f}" if row["wall_s"] else "-"
        step_s = f"{row['step_s_median']:.2f}" if row["step_s_median"] else "-"
        turns = "{:.2f} -> {:.2f}".format(*row["turns_start_end"]) if row["turns_start_end"] else "-"
        lines.append(
            f"| {algorithm} | {seed} | {row['success_start']:.2f} -> {row['success_end']:.2f} | {at} | "
            f"{row['step_to_0.5']} | {row['step_to_0.8']} | {turns} | {step_s} | {wall} |"
        )
    lines += [
        "",
        f"| variant | seeds | success start -> end, median | end, min | {head} (mean) | whole run (mean) "
        "| step to 0.5, median | reached 0.5 | wall min, median |",
        "|---|---|---|---|" + "---|" * len(points) + "---|---|---|---|",
    ]
    for variant, rows in sorted(by_variant.items()):
        at = " | ".join(
            f"{np.mean([r['success_at'].get(str(p), r['success_at'].get(p, np.nan)) for r in rows]):.3f}"
            for p in points
        )
        reached = [r["step_to_0.5"] for r in rows if r["step_to_0.5"] is not None]
        walls = [r["wall_s"] / 60 for r in rows if r["wall_s"]]
        lines.append(
            f"| {variant} | {len(rows)} | {np.median([r['success_start'] for r in rows]):.2f} -> "
            f"{np.median([r['success_end'] for r in rows]):.2f} | {min(r['success_end'] for r in rows):.2f} | {at} | "
            f"{np.mean([r['success_mean'] for r in rows]):.3f} | "
            f"{np.median(reached) if reached else '-'} | {len(reached)}/{len(rows)} | "
            f"{np.median(walls) if walls else float('nan'):.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["rloo", "turn_rloo"], choices=sorted(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=16, help="rollout.tasks_per_step (the quickstart's is 32)")
    parser.add_argument("--root", type=Path, default=Path("runs/per_turn_rewards"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/per_turn_rewards.json"))
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (2: one seed's pair side by side)")
    parser.add_argument("--report-only", action="store_true", help="summarise the runs in --root, train nothing")
    args = parser.parse_args()
    root = REPO / args.root
    root.mkdir(parents=True, exist_ok=True)
    out = REPO / args.out
    previous = json.loads(out.read_text()) if out.exists() else {}
    walls = {name: row.get("wall_s") for name, row in previous.get("runs", {}).items()}
    jobs = [(variant, seed) for seed in args.seeds for variant in args.variants]
    if not args.report_only:
        walls.update(run_all(jobs, args, root))
    points = [10, args.steps // 4, args.steps // 2, 3 * args.steps // 4, args.steps]
    results = dict(previous.get("runs", {}))  # runs of earlier invocations stay in the file
    for variant, seed in jobs:
        name = f"{variant}-seed{seed}"
        if (root / name).is_dir():
            results[name] = summarise(root / name, walls.get(name), points)
    settings = {"config": CONFIG, "steps": args.steps, "tasks_per_step": args.tasks, "variants": VARIANTS}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": settings, "runs": results}, indent=1) + "\n")
    print(table(json.loads(out.read_text())["runs"], points))


if __name__ == "__main__":
    main()
