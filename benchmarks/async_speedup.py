"""Asynchronous rollouts side by side: rollout.max_staleness = 0 (lockstep), 1, 2 on the same configs and steps.

    python benchmarks/async_speedup.py                                   # quickstart and frozen_lake, K = 0 1 2
    python benchmarks/async_speedup.py --envs quickstart --steps 300 --rounds 2

Each run is `mpirun -n N agentrl train CONFIG rollout.max_staleness=K steps=S` (evaluation and checkpoints
off), so every K trains the same number of episodes. With --rounds R the K values run in turn R times
(0 1 2 0 1 2 ...) and medians are taken, so a machine that gets busier midway affects every K alike.

Printed per env and K, from each run's TensorBoard events: wall time of the command, training steps per
second (steps over the summed `time/step`), the speedup over K = 0, the trainer's idle fraction (its
waits for rollouts, `time/wait_rollout`, over its step time), the rollout ranks' idle fraction (their
waits for weights or for the trainer to take a batch, `time/rollout_idle`, over that plus their
generation time), the mean weight lag of the trained tokens, and the success rate over the last 10%
of steps. Then, for separate devices per role, what the lockstep run's phase times give on paper:
a lockstep step costs rollout + train + weight sync, an overlapped one the larger of rollout and
train + weight sync.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import ENVS, scalars, window_means

REPO = Path(__file__).resolve().parents[1]
DEFAULT_STEPS = {"quickstart": 300, "frozen_lake": 150}


def run(env: str, ahead: int, steps: int, seed: int, run_dir: Path, extra: list[str]) -> dict:
    config, ranks = ENVS[env]
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        "mpirun", "-n", str(ranks), "agentrl", "train", config, f"rollout.max_staleness={ahead}",
        f"steps={steps}", f"seed={seed}", f"run_dir={run_dir}", "eval.every=0", "checkpoint.every=0",
        "logging.progress=false", *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
    wall = time.perf_counter() - started
    if result.returncode:
        log = run_dir.with_suffix(".log")
        log.write_bytes(result.stdout + result.stderr)
        raise SystemExit(f"{env} K={ahead} failed (exit {result.returncode}); see {log}")

    def total(tag: str) -> float:
        return float(sum(v for _, v in scalars(run_dir, tag)))

    def median(tag: str) -> float:
        return float(np.median([v for _, v in scalars(run_dir, tag)]))

    step_s = total("time/step")
    rollout_busy, rollout_idle = total("time/rollout"), total("time/rollout_idle")
    return {
        "wall_s": wall,
        "steps_per_s": steps / step_s,
        "trainer_idle": total("time/wait_rollout") / step_s,
        "rollout_idle": rollout_idle / max(rollout_busy + rollout_idle, 1e-9),
        "lag": float(np.mean([v for _, v in scalars(run_dir, "async/lag_mean")])),
        "success_end": window_means(scalars(run_dir, "episode/success_rate"))[1],
        "rollout_s": median("time/rollout"),
        "train_s": median("time/train"),
        "sync_s": median("time/weight_sync"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="*", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--staleness", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="default: 300 quickstart, 150 frozen_lake")
    parser.add_argument("--rounds", type=int, default=1, help="run every K this many times, in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/async_speedup"))
    parser.add_argument("overrides", nargs="*", help="key=value added to every run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print("| env | K | wall | steps/s | speedup | trainer idle | rollout idle | lag | success (last 10%) |")
    print("|---|---|---|---|---|---|---|---|---|")
    lockstep_phases = {}
    for env in args.envs:
        steps = args.steps or DEFAULT_STEPS[env]
        runs: dict[int, list[dict]] = {k: [] for k in args.staleness}
        for round_ in range(args.rounds):
            for ahead in args.staleness:
                run_dir = args.out / f"{env}-k{ahead}-r{round_}"
                runs[ahead].append(run(env, ahead, steps, args.seed, run_dir, args.overrides))
        medians = {k: {key: float(np.median([r[key] for r in rs])) for key in rs[0]} for k, rs in runs.items()}
        base = medians.get(0, medians[args.staleness[0]])["steps_per_s"]
        for ahead, m in medians.items():
            print(
                f"| {env} | {ahead} | {m['wall_s']:.0f} s | {m['steps_per_s']:.3f} | {m['steps_per_s'] / base:.2f}x | "
                f"{m['trainer_idle']:.2f} | {m['rollout_idle']:.2f} | {m['lag']:.2f} | {m['success_end']:.2f} |",
                flush=True,
            )
        if 0 in medians:
            lockstep_phases[env] = medians[0]
    if lockstep_phases:
        print("\nOn paper, one device per role (phase medians of the K = 0 runs):\n")
        print("| env | rollout | train | weight sync | lockstep step | overlapped step | speedup |")
        print("|---|---|---|---|---|---|---|")
        for env, m in lockstep_phases.items():
            lockstep = m["rollout_s"] + m["train_s"] + m["sync_s"]
            overlapped = max(m["rollout_s"], m["train_s"] + m["sync_s"])
            print(
                f"| {env} | {m['rollout_s']:.3f} s | {m['train_s']:.3f} s | {m['sync_s']:.3f} s | {lockstep:.3f} s | "
                f"{overlapped:.3f} s | {lockstep / overlapped:.2f}x |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
