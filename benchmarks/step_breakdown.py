"""Where a training step's time goes, per role, on the quickstart and frozen_lake (docs/performance.md).

    python benchmarks/step_breakdown.py                        # both envs, 60 steps, the scaling variants
    python benchmarks/step_breakdown.py --envs quickstart --steps 100 --no-variants

Each run is `mpirun -n N agentrl train CONFIG steps=S` (evaluation and checkpoints off); medians over
its steps after the first 5 (warm-up). Lockstep, so a step is: the rollout ranks generate and step envs
(`generate`, `env`: the rollout wall minus generation, i.e. env round trips and the agent loop), the
batch travels (`transfer`: the trainer's receive once the message is there), the trainer trains
(`train`) and publishes weights (`weight_sync`); `other` is the rest of the step (logging, all-reduces
of metrics). The rollout ranks idle while the trainer trains and syncs; the trainer idles while they
generate. `transfer %` is the batch's share of the step (target: under 2%).

Variants (unless --no-variants): the quickstart with one rollout rank instead of two, and with a
model twice as wide (hidden 128 instead of 64), to show how each phase scales.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import ENVS, run_or_exit, scalars

REPO = Path(__file__).resolve().parents[1]
PHASES = ["generate", "env", "transfer", "train", "weight_sync"]
WARMUP = 5


def run(name: str, env: str, ranks: int, steps: int, out: Path, extra: list[str]) -> dict[str, float]:
    config = ENVS[env][0]
    run_dir = out / name.replace(" ", "_").replace(",", "")
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        "mpirun", "-n", str(ranks), "agentrl", "train", config, f"steps={steps}", f"run_dir={run_dir}",
        "eval.every=0", "checkpoint.every=0", "logging.progress=false", *extra,
    ]  # fmt: skip
    run_or_exit(command, run_dir, name)

    def median(tag: str) -> float:
        return float(np.median([v for s, v in scalars(run_dir, tag) if s >= WARMUP]))

    row = {phase: median(f"time/{phase}") for phase in PHASES}
    row["step"] = median("time/step")
    row["rollout"] = median("time/rollout")
    per_step = {tag: dict(scalars(run_dir, f"time/{tag}")) for tag in ("step", "wait_rollout", "train", "weight_sync")}
    other = [
        per_step["step"][s] - per_step["wait_rollout"][s] - per_step["train"][s] - per_step["weight_sync"][s]
        for s in per_step["step"]
        if s >= WARMUP
    ]
    row["other"] = float(np.median(other))
    row["rollout_idle"] = max(0.0, row["step"] - row["rollout"]) / row["step"]
    row["trainer_idle"] = max(0.0, median("time/wait_rollout") - row["transfer"]) / row["step"]
    row["transfer_pct"] = 100 * row["transfer"] / row["step"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="*", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "step_breakdown")
    args = parser.parse_args()
    runs = [(env, env, ENVS[env][1], []) for env in args.envs]
    if not args.no_variants and "quickstart" in args.envs:
        runs.append(("quickstart, 1 rollout rank", "quickstart", 3, ["layout.rollout=1"]))
        wide = [f"model.path={args.out / 'wide-model'}", "model.tiny.hidden_size=128", "model.tiny.num_heads=4"]
        runs.append(("quickstart, hidden 128", "quickstart", 4, wide))
    rows = {}
    for name, env, ranks, extra in runs:
        rows[name] = run(name, env, ranks, args.steps, args.out, extra)
        print(f"{name}: {rows[name]}", flush=True)
    columns = [*PHASES, "other", "step", "rollout_idle", "trainer_idle", "transfer_pct"]
    print(f"\nmedian seconds per step over steps {WARMUP}..{args.steps - 1} (idle: share of the step)\n")
    print("| run | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, row in rows.items():
        cells = [f"{row[c]:.3f}" if c not in ("rollout_idle", "trainer_idle", "transfer_pct") else "" for c in columns]
        cells[-3:] = [f"{row['rollout_idle']:.2f}", f"{row['trainer_idle']:.2f}", f"{row['transfer_pct']:.2f}%"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
