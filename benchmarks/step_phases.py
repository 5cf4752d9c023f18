"""Where a training step's wall time goes, rank by rank: agentrl's functions timed from outside (issue 53, item 4).

    python benchmarks/step_phases.py run --out DIR CONFIG [key=value ...]                 # one process
    mpirun -n 4 python benchmarks/step_phases.py run --out DIR CONFIG layout.rollout=2 ...  # every rank
    python benchmarks/step_phases.py report DIR [--warmup 5]                              # the table

`run` wraps the functions of PHASES with a wall-clock timer (a few microseconds a call), then runs
`agentrl train CONFIG ...` in this process; at exit each rank writes the intervals it spent in each phase to
DIR/rank_N.json. `report` keeps the intervals between the end of the trainer's step `--warmup` and the end of its
last step, and prints, per rank and role, milliseconds per step in each phase, wall and the CPU of the thread that
ran it (under contention a phase's wall holds waits for the GIL or a core; its CPU is what its work costs; a phase
nested in another is counted in both: `backward` inside `micro step`, inside `train`), the rank's CPU seconds per
step, and the part of the step its main thread spent in no phase (for a trainer or rollout rank: waiting for the
other side, or work outside the named phases: the agent loop, asyncio, packing).

A name in PHASES that no longer exists (code moved) is reported and left out; the rest still run.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PHASES = [  # (phase, "module:Attribute.path"): each call of the function counts in the phase
    ("train", "agentrl.trainer.policy_trainer:PolicyTrainer.train_and_sum"),
    ("micro step", "agentrl.trainer.policy_trainer:PolicyTrainer._micro_step"),
    ("policy forward", "agentrl.trainer.policy_trainer:PolicyTrainer._position_logits"),
    ("backward", "torch:Tensor.backward"),
    ("optimizer", "torch.optim:AdamW.step"),
    ("grad clip", "agentrl.trainer.policy_trainer:PolicyTrainer._clipped_norm"),
    ("logprob recompute", "agentrl.trainer.policy_trainer:PolicyTrainer._old_logprobs"),
    ("advantages", "agentrl.algorithms.base:PolicyGradient.advantages"),
    ("weights out", "agentrl.weights.base:InProcessWeightCopy.send"),
    ("weights out", "agentrl.weights.shm:SharedMemoryWeights.send"),
    ("weights out", "agentrl.weights.mpi:MPIWeightBroadcast.send"),
    ("weights in", "agentrl.weights.shm:SharedMemoryWeights.receive"),
    ("weights in", "agentrl.weights.mpi:MPIWeightBroadcast.receive"),
    ("wait batch", "agentrl.transport:wait_for_message"),
    ("log", "agentrl.tracking.run_logger:RunLogger.log"),
    ("checkpoint", "agentrl.trainer.checkpoint:save_step"),
    ("rollout", "agentrl.rollout.worker:RolloutWorker.collect"),
    ("generate", "agentrl.engine.torch_engine:TorchEngine._run_batch"),
    ("generate", "agentrl.engine.continuous:ContinuousTorchEngine._step"),
    ("generate", "agentrl.engine.continuous:ContinuousTorchEngine._step_on_slots"),
    ("env", "agentrl.env.host:EnvHost.handle_batch"),
    ("chat tokens", "agentrl.models.chat_format:ChatFormat.prompt_ids"),
    ("chat tokens", "agentrl.models.chat_format:ChatFormat.observation_ids"),
    ("chat tokens", "agentrl.models.chat_format:ChatFormat.decode"),
    ("pack", "agentrl.trajectory:pack"),
    ("prefix layout", "agentrl.trainer.policy_trainer:PolicyTrainer._prefix_layout"),
    ("gradient sum", "agentrl.trainer.policy_trainer:PolicyTrainer._sync_gradients"),
    ("tasks take", "agentrl.data.tasks:DatasetTasks.take"),
    # collectives between ranks (hybrid ranks, several trainers); `wait for ranks` is their wait for the slowest
    ("wait for ranks", "agentrl.transport:all_here"),
    ("allreduce", "agentrl.transport:allreduce_sum"),
    ("allgather", "agentrl.transport:allgather_object"),
    ("exchange", "agentrl.transport:exchange"),
    ("ship", "agentrl.roles.rollout:Lockstep.ship"),
    ("ship", "agentrl.roles.rollout:RunningAhead.ship"),
    ("next weights", "agentrl.roles.rollout:Lockstep.next_weights"),
    ("next weights", "agentrl.roles.rollout:RunningAhead.next_weights"),
]
STEP_PHASE = "train"  # the trainer's step: the window is cut at its calls' ends


class Recorder:
    """Intervals per phase, on every thread; nested calls of one phase on one thread count once."""

    def __init__(self):
        self.intervals: dict[str, list[tuple[float, float, bool]]] = {}
        self.depth = threading.local()
        self.main = threading.main_thread()
        self.cpu: list[tuple[float, float]] = []

    def wrap(self, phase: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            depths = self.depth.__dict__.setdefault("by_phase", {})
            if depths.get(phase):
                return function(*args, **kwargs)
            depths[phase] = 1
            started, cpu_started = time.time(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                depths[phase] = 0
                ended = time.time()
                main = threading.current_thread() is self.main
                cpu = time.thread_time() - cpu_started
                self.intervals.setdefault(phase, []).append((started, ended, main, cpu))
                if phase == STEP_PHASE or phase in ("rollout", "env"):
                    self.cpu.append((ended, time.process_time()))

        return timed


def install(recorder: Recorder) -> list[str]:
    missing = []
    for phase, target in PHASES:
        module_name, _, path = target.partition(":")
        try:
            owner = importlib.import_module(module_name)
            *parents, name = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            setattr(owner, name, recorder.wrap(phase, getattr(owner, name)))
        except (ImportError, AttributeError) as error:
            missing.append(f"{target} ({error})")
    return missing


def run(args) -> None:
    from agentrl import cli, transport

    recorder = Recorder()
    missing = install(recorder)
    rank = transport.world_rank()
    if missing and rank == 0:
        print("step_phases: not timed (moved or gone):\n  " + "\n  ".join(missing), file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    @atexit.register
    def dump() -> None:
        (out / f"rank_{rank}.json").write_text(
            json.dumps({"rank": rank, "pid": os.getpid(), "intervals": recorder.intervals, "cpu": recorder.cpu})
        )

    sys.argv = ["agentrl", "train", *args.train]
    cli.entry_point()


def clipped(intervals, start: float, end: float, main_only: bool = False) -> list[tuple[float, float]]:
    return [
        (max(a, start), min(b, end)) for a, b, main, _ in intervals if b > start and a < end and (main or not main_only)
    ]


def cpu_inside(intervals, start: float, end: float) -> float:
    """CPU seconds of the phase's own threads in its calls that ended inside the window."""
    return sum(cpu for _, b, _, cpu in intervals if start < b <= end)


def union_seconds(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def cpu_between(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    inside = [cpu for t, cpu in samples if start <= t <= end + 1e-3]
    before = [cpu for t, cpu in samples if t <= start + 1e-3]
    if not inside or not before:
        return None
    return inside[-1] - before[-1]


def report(args) -> None:
    folder = Path(args.dir)
    ranks = sorted((json.loads(p.read_text()) for p in folder.glob("rank_*.json")), key=lambda r: r["rank"])
    if not ranks:
        raise SystemExit(f"step_phases: no rank_*.json in {folder}; run `step_phases.py run --out {folder} ...` first")
    leader = next((r for r in ranks if STEP_PHASE in r["intervals"]), ranks[0])  # one trainer rank's step ends
    steps = sorted(interval[1] for interval in leader["intervals"].get(STEP_PHASE, []))
    if len(steps) <= args.warmup + 1:
        raise SystemExit(f"step_phases: {len(steps)} trainer steps; need more than --warmup {args.warmup} + 1")
    start, end = steps[args.warmup - 1] if args.warmup else steps[0], steps[-1]
    count = len(steps) - max(args.warmup, 1)
    per_step = (end - start) / count
    print(f"{count} steps timed, {per_step * 1e3:.1f} ms a step (the trainer's step ends)")
    phases = list(dict.fromkeys(phase for phase, _ in PHASES))
    header = "| phase | " + " | ".join(f"rank {r['rank']}: {role(r)}, wall / CPU" for r in ranks) + " |"
    lines = [header, "|---|" + "---|" * len(ranks)]
    for phase in phases:
        cells = []
        for r in ranks:
            intervals = r["intervals"].get(phase, [])
            spans = clipped(intervals, start, end)
            wall, cpu = union_seconds(spans) / count * 1e3, cpu_inside(intervals, start, end) / count * 1e3
            cells.append(f"{wall:.1f} / {cpu:.1f}" if spans else "")
        if any(cells):
            lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    idle, cpu = [], []
    for r in ranks:
        main = [span for phase in phases for span in clipped(r["intervals"].get(phase, []), start, end, True)]
        idle.append(f"{(end - start - union_seconds(main)) / count * 1e3:.1f}")
        used = cpu_between(r["cpu"], start, end)
        cpu.append("" if used is None else f"{used / count * 1e3:.1f}")
    lines.append("| main thread in no phase | " + " | ".join(idle) + " |")
    lines.append("| CPU ms (all threads) | " + " | ".join(cpu) + " |")
    print("\n".join(lines))


def role(rank: dict) -> str:
    names = set(rank["intervals"])
    if STEP_PHASE in names and "rollout" in names:
        return "all"
    if STEP_PHASE in names:
        return "trainer"
    if "rollout" in names:
        return "rollout"
    return "env" if "env" in names else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    running = commands.add_parser("run", help="train CONFIG with the phases timed")
    running.add_argument("--out", required=True, help="folder for rank_N.json")
    running.add_argument("train", nargs=argparse.REMAINDER, help="CONFIG [key=value ...], as for agentrl train")
    reporting = commands.add_parser("report", help="the table of a run's folder")
    reporting.add_argument("dir")
    reporting.add_argument("--warmup", type=int, default=5, help="trainer steps left out at the start")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
