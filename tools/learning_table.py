"""The learning table from a sweep over algorithms x envs x seeds (launch/sweeps/learning_table.yaml).

    agentrl sweep launch/sweeps/learning_table.yaml
    python tools/learning_table.py runs/sweeps/learning_table                        # print the tables
    python tools/learning_table.py runs/sweeps/learning_table --write docs/algorithms.md README.md
    python tools/learning_table.py runs/sweeps/learning_table_quickstart runs/sweeps/learning_table_frozen_lake

Per trial, from its TensorBoard events: the policy's success rate (`rollout/success_rate`, the policy's own over
each step's first round of tasks; dapo's trained batch leaves out the groups it drops) over the first 2% of steps
and over the last 10%, the first step whose trailing 50-step mean reaches 0.8 and the training time to it, the
median step time, and PPO's explained variance. Per cell (env, algorithm), over its seeds: the median and the
minimum of the last-10% success, how many seeds end above 0.8, the median step to 0.8 and the step time against
grpo's. `--write` replaces the text between `<!-- learning-table:start -->` and `<!-- learning-table:end -->` in
each file: the full table where the marker says `full`, else the short one (env, algorithm, median, min).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import yaml

from agentrl.sweep.objective import read_run_scalars, window_means
from agentrl.sweep.spec import parse_spec
from agentrl.sweep.status import rows
from agentrl.sweep.study import SPEC_FILE, Sweep

TARGET = 0.8
STALL_FACTOR = 20  # a step this many times the trial's median step was stalled from outside (its processes paused)
SUCCESS_TAGS = ("rollout/success_rate", "episode/success_rate")  # the policy's own first, else the trained batch's
MARKERS = re.compile(r"(<!-- learning-table:start( full)? -->\n)(.*?)(<!-- learning-table:end -->)", re.S)


def steps_to(points: list[tuple[int, float]], target: float = TARGET, window: int = 50) -> int | None:
    """The first step at which the mean of the last `window` points reaches `target` (None: never)."""
    values = np.array([v for _, v in points])
    if len(values) < window:
        return None
    trailing = np.convolve(values, np.ones(window) / window, mode="valid")
    hits = np.flatnonzero(trailing >= target)
    return int(points[hits[0] + window - 1][0]) if len(hits) else None


def training_minutes(step_times: list[tuple[int, float]], up_to: int) -> float:
    """Minutes spent on steps 0..`up_to`, each step counted at most STALL_FACTOR x the median step: a trial whose
    processes were paused (a sweep stopped with SIGSTOP, a suspended machine) logs the pause as one long step."""
    if not step_times:
        return 0.0
    median_s = float(np.median([v for _, v in step_times]))
    return sum(min(v, STALL_FACTOR * median_s) for s, v in step_times if s <= up_to) / 60


def trial_numbers(run_dir: str) -> dict | None:
    """One trial's learning numbers, or None if it logged no success rate."""
    logged = read_run_scalars(run_dir, [*SUCCESS_TAGS, "time/step", "train/explained_variance"])
    success = next((logged[tag] for tag in SUCCESS_TAGS if tag in logged), None)
    if not success:
        return None
    start, end = window_means(success)
    step_times = logged.get("time/step", [])
    reached = steps_to(success)
    variance = logged.get("train/explained_variance")
    return {
        "start": start,
        "end": end,
        "steps_to": reached,
        "minutes_to": training_minutes(step_times, reached) if reached is not None else None,
        "step_s": float(np.median([v for _, v in step_times])) if step_times else None,
        "ev": window_means(variance) if variance else None,
    }


def cells(sweep: Sweep, study) -> dict[tuple[str, str], list[dict]]:
    """(env, algorithm) -> the numbers of its finished trials, one per seed."""
    out: dict[tuple[str, str], list[dict]] = {}
    for row in rows(sweep, study):
        if row["state"] != "complete":
            continue
        numbers = trial_numbers(row["run_dir"])
        if numbers is None:
            continue
        key = (row["params"].get("base", "-"), row["params"]["algorithm.name"])
        out.setdefault(key, []).append({**numbers, "seed": row["seed"]})
    return dict(sorted(out.items()))


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def full_table(table: dict[tuple[str, str], list[dict]]) -> str:
    lines = [
        f"| env | algorithm | seeds | success start -> end, median | end, min | seeds above {TARGET} | "
        f"step to {TARGET}, median (training min) | step vs grpo | PPO explained variance |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (env, algorithm), trials in table.items():
        grpo = median([t["step_s"] for t in table.get((env, "grpo"), [])])
        step_s = median([t["step_s"] for t in trials])
        reached = [t for t in trials if t["steps_to"] is not None]
        to_target = (
            f"{median([t['steps_to'] for t in reached]):.0f} ({median([t['minutes_to'] for t in reached]):.1f}) "
            f"on {len(reached)}/{len(trials)}"
            if reached
            else "not reached"
        )
        ev = [t["ev"] for t in trials if t["ev"]]
        lines.append(
            f"| {env} | {algorithm} | {', '.join(str(t['seed']) for t in sorted(trials, key=lambda t: t['seed']))} | "
            f"{median([t['start'] for t in trials]):.2f} -> {median([t['end'] for t in trials]):.2f} | "
            f"{min(t['end'] for t in trials):.2f} | {sum(t['end'] > TARGET for t in trials)}/{len(trials)} | "
            f"{to_target} | {f'{step_s / grpo:.2f}x' if grpo and step_s else ''} | "
            f"{f'{median([e[0] for e in ev]):.2f} -> {median([e[1] for e in ev]):.2f}' if ev else ''} |"
        )
    return "\n".join(lines) + "\n"


def short_table(table: dict[tuple[str, str], list[dict]]) -> str:
    lines = [
        f"| env | algorithm | success over the last 10%: median (min) of {max(map(len, table.values()), default=0)} "
        "seeds |",
        "|---|---|---|",
    ]
    for (env, algorithm), trials in table.items():
        ends = [t["end"] for t in trials]
        lines.append(f"| {env} | {algorithm} | {median(ends):.2f} ({min(ends):.2f}) |")
    return "\n".join(lines) + "\n"


def write_into(path: Path, table: dict) -> None:
    text = path.read_text()
    if not MARKERS.search(text):
        raise SystemExit(f"{path} has no <!-- learning-table:start --> ... <!-- learning-table:end --> block")
    path.write_text(
        MARKERS.sub(lambda m: m.group(1) + (full_table(table) if m.group(2) else short_table(table)) + m.group(4), text)
    )


def sweep_cells(sweep_dir: Path) -> dict[tuple[str, str], list[dict]]:
    """`cells` of the sweep saved in `sweep_dir`, which must search algorithm.name."""
    saved = sweep_dir / SPEC_FILE
    if not saved.is_file():
        raise SystemExit(f"{sweep_dir} is not a sweep folder (no {SPEC_FILE}); run agentrl sweep SPEC first")
    sweep = Sweep(parse_spec(yaml.safe_load(saved.read_text()), str(saved)))
    if "algorithm.name" not in sweep.spec.space:
        raise SystemExit(f"{saved} does not search algorithm.name; the learning table needs one row per algorithm")
    return cells(sweep, sweep.study())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dirs", type=Path, nargs="+", help="one sweep folder, or one per part of the table")
    parser.add_argument("--write", nargs="*", type=Path, default=[], help="files whose learning-table block to fill")
    args = parser.parse_args()
    table: dict[tuple[str, str], list[dict]] = {}
    for sweep_dir in args.sweep_dirs:
        for key, trials in sweep_cells(sweep_dir).items():
            table.setdefault(key, []).extend(trials)
    if not table:
        raise SystemExit(f"{' '.join(map(str, args.sweep_dirs))}: no finished trial yet")
    table = dict(sorted(table.items()))
    print(full_table(table))
    print(short_table(table))
    for path in args.write:
        write_into(path, table)
        print(f"wrote the table into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
