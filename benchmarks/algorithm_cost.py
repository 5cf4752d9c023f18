"""What each registered algorithm costs per training step, relative to grpo, measured side by side.

    python benchmarks/algorithm_cost.py                        # every algorithm, quickstart, 30 steps, 2 rounds
    python benchmarks/algorithm_cost.py --algorithms grpo ppo --steps 40 --rounds 3

The learning table (a sweep, launch/sweeps/learning_table.yaml) runs each algorithm for hundreds of steps one
after another, so its step times also carry whatever else the machine did meanwhile. Here every algorithm
runs a short `mpirun -n 4 agentrl train launch/configs/quickstart.yaml algorithm.name=NAME steps=S`,
the algorithms in turn, R rounds, so load hits them alike. Printed: the median `time/step`,
`time/rollout` and `time/train` over steps after the first 5, medians over rounds, and the step time
over grpo's. Short runs see the policy early in training; a step's cost also depends on how long its
episodes are, which changes as a policy learns.
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
WARMUP = 5
PHASES = {"step_s": "time/step", "rollout_s": "time/rollout", "train_s": "time/train"}


def run(algorithm: str, steps: int, run_dir: Path) -> dict[str, float]:
    config, ranks = ENVS["quickstart"]
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        "mpirun", "-n", str(ranks), "agentrl", "train", config, f"algorithm.name={algorithm}", f"steps={steps}",
        f"run_dir={run_dir}", "eval.every=0", "checkpoint.every=0", "logging.progress=false",
    ]  # fmt: skip
    run_or_exit(command, run_dir, algorithm)
    return {
        name: float(np.median([v for s, v in scalars(run_dir, tag) if s >= WARMUP])) for name, tag in PHASES.items()
    }


def main() -> int:
    from agentrl.algorithms.registry import registered_names

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="*", default=None, help="default: every registered name")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "algorithm_cost")
    args = parser.parse_args()
    names = args.algorithms or sorted(registered_names())
    if "grpo" not in names:
        names = ["grpo", *names]
    rows: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names:
            rows[name].append(run(name, args.steps, args.out / f"{name}-r{round_}"))
            print(f"round {round_}: {name}: {rows[name][-1]}", flush=True)
    medians = {name: {k: float(np.median([r[k] for r in runs])) for k in PHASES} for name, runs in rows.items()}
    print(f"\nquickstart, {args.steps} steps x {args.rounds} round(s), medians over steps {WARMUP}.. and rounds\n")
    print("| algorithm | step | rollout | train | step vs grpo |")
    print("|---|---|---|---|---|")
    for name, m in medians.items():
        ratio = m["step_s"] / medians["grpo"]["step_s"]
        print(f"| {name} | {m['step_s']:.3f} s | {m['rollout_s']:.3f} s | {m['train_s']:.3f} s | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
