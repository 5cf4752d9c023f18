"""Static vs dynamic task dispatch on a ragged workload, side by side.

    python benchmarks/bench_dispatch.py                       # both workloads, 40 steps per run, 2 rounds
    python benchmarks/bench_dispatch.py --workloads slow_rank --steps 60 --rounds 3 --in-flight 2 4

The quickstart (tiny model, guess_number 1..7) on 3 ranks (1 trainer, 2 rollout, envs in-process)
with `benchmarks/ragged_env.py`, two workloads:
- `ragged`: a quarter of the tasks burn 20 ms of CPU per env step, so the rank that draws more of
  them in a step is that step's straggler;
- `slow_rank`: every env step on the second rollout rank burns 5 ms of CPU (a node with a slower
  env), so under the static split that rank holds every step.
Each run is `mpirun -n 3 agentrl train launch/configs/quickstart.yaml env.id=benchmarks.ragged_env:
RaggedGuessEnv rollout.dispatch=... steps=S`; the variants run in turn, R rounds, so load on the
machine hits them alike.

Printed per variant, medians over steps and then over rounds: the step's rollout time (the slowest
rollout rank, `time/rollout`), the spread between the slowest and the fastest rank
(`time/rollout_spread`), the whole step (`time/step`), and the fewest and most groups a rank ran
in a step (`rollout/rank_groups_min`/`_max`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import run_or_exit, scalars

REPO = Path(__file__).resolve().parents[1]
CONFIG = "launch/configs/quickstart.yaml"
ENV = "benchmarks.ragged_env:RaggedGuessEnv"
WORKLOADS = {  # env.kwargs beside the quickstart's own
    "ragged": "{low: 1, high: 7, max_guesses: 3, valid_reward: 0.1, slow_every: 4, slow_step_s: 0.02}",
    "slow_rank": "{low: 1, high: 7, max_guesses: 3, valid_reward: 0.1, slow_rank: 2, slow_step_s: 0.005}",
}
COLUMNS = {
    "rollout_s": "time/rollout",
    "spread_s": "time/rollout_spread",
    "step_s": "time/step",
    "groups_min": "rollout/rank_groups_min",
    "groups_max": "rollout/rank_groups_max",
}


def run(workload: str, variant: list[str], steps: int, run_dir: Path) -> dict[str, float]:
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        "mpirun", "-n", "3", "agentrl", "train", CONFIG, f"env.id={ENV}", f"env.kwargs={WORKLOADS[workload]}",
        "layout.env=0", f"steps={steps}",
        f"run_dir={run_dir}", "eval.every=0", "checkpoint.every=0", "logging.progress=false", *variant,
    ]  # fmt: skip
    pythonpath = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"  # benchmarks.ragged_env
    wall = run_or_exit(command, run_dir, " ".join(variant), {"PYTHONPATH": pythonpath})
    row = {name: float(np.median([v for s, v in scalars(run_dir, tag) if s > 0])) for name, tag in COLUMNS.items()}
    row["wall_s"] = wall
    return row


def table(workload: str, rows: dict[str, list[dict]], args) -> None:
    print(f"\n{workload}: {args.steps} steps x {args.rounds} round(s), medians (step 0 left out)\n")
    keys = [*COLUMNS, "wall_s"]
    print("| dispatch | " + " | ".join(keys) + " | step vs static |")
    print("|---|" + "---|" * (len(keys) + 1))
    base = np.median([r["step_s"] for r in rows["static"]])
    for name, runs in rows.items():
        medians = {key: float(np.median([r[key] for r in runs])) for key in keys}
        cells = " | ".join(f"{medians[key]:.3f}" for key in keys)
        print(f"| {name} | {cells} | {medians['step_s'] / base:.2f}x |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--in-flight", type=int, nargs="*", default=[4, 2], help="dynamic variants' groups_in_flight")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench_dispatch")
    args = parser.parse_args()
    variants = {"static": ["rollout.dispatch=static"]}
    for count in args.in_flight:
        variants[f"dynamic, {count} in flight"] = ["rollout.dispatch=dynamic", f"rollout.groups_in_flight={count}"]
    for workload in args.workloads:
        rows: dict[str, list[dict]] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            for index, (name, variant) in enumerate(variants.items()):
                run_dir = args.out / f"{workload}-r{round_}-v{index}"
                rows[name].append(run(workload, variant, args.steps, run_dir))
                print(f"{workload}, round {round_}: {name}: {rows[name][-1]}", flush=True)
        table(workload, rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
