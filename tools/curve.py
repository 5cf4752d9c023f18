"""Print a run's learning curve from its TensorBoard events: means over windows of steps.

python tools/curve.py runs/quickstart [--metric episode/success_rate] [--window 50]
"""

import argparse
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--metric", default="episode/success_rate")
    parser.add_argument("--window", type=int, default=50)
    args = parser.parse_args()
    accumulator = EventAccumulator(str(Path(args.run_dir) / "tb"))
    accumulator.Reload()
    points = sorted((e.step, e.value) for e in accumulator.Scalars(args.metric))
    steps = np.array([s for s, _ in points])
    values = np.array([v for _, v in points])
    seconds = dict((e.step, e.value) for e in accumulator.Scalars("time/step"))
    print(f"{args.metric} over {len(points)} steps of {args.run_dir}")
    print(f"{'steps':>11}  {'mean':>6}  {'min':>6}  {'max':>6}  {'elapsed s':>9}")
    elapsed = 0.0
    for start in range(0, int(steps.max()) + 1, args.window):
        inside = (steps >= start) & (steps < start + args.window)
        elapsed += sum(seconds.get(int(s), 0.0) for s in steps[inside])
        chunk = values[inside]
        span = f"{start:>5}-{start + args.window - 1:<5}"
        print(f"{span}  {chunk.mean():6.3f}  {chunk.min():6.3f}  {chunk.max():6.3f}  {elapsed:9.0f}")


if __name__ == "__main__":
    main()
