"""The curves of multi-policy runs (docs/multi-agent.md) as text: chosen scalars of each policy, every N steps.

python benchmarks/multi_agent_curves.py RUN_DIR [RUN_DIR ...] --tags game_eval/win_rate_vs/random --every 10
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def read(policy_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(policy_dir / "tb"), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--tags", nargs="+", default=["episode/reward_mean"])
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    for run in args.runs:
        for policy_dir in sorted((run / "policies").iterdir()):
            logged = read(policy_dir)
            for tag in args.tags:
                values = logged.get(tag)
                if not values:
                    continue
                steps = [step for step, _ in values]
                shown = [f"{step}:{value:.2f}" for step, value in values if step % args.every == 0 or step == steps[-1]]
                tail = [value for step, value in values if step >= steps[-1] - max(1, len(steps) // 10) + 1]
                head = [value for step, value in values[: max(1, len(values) // 10)]]
                print(f"{run.name} {policy_dir.name} {tag}: first {np.mean(head):.2f} -> last 10% {np.mean(tail):.2f}")
                print("   " + " ".join(shown))


if __name__ == "__main__":
    main()
