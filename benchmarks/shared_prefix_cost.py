"""What `trainer.shared_prefix` saves in a train step: the same batch trained with and without, taking turns.

    python benchmarks/shared_prefix_cost.py                 # the digit and guess batch shapes, 40 steps each way
    python benchmarks/shared_prefix_cost.py --steps 20 --threads 2
    python benchmarks/shared_prefix_cost.py --steps 20 --baseline ../main --unfused   # before/after, side by side
    python benchmarks/shared_prefix_cost.py --freed-memory          # also with runtime.keep_freed_memory off
    python benchmarks/shared_prefix_cost.py --shapes guess --compile --warmup 8   # also torch.compile'd

Each variant's PolicyTrainer loads the quickstart's tiny model shape (hidden 64, 2 layers, vocab 128) and trains
`--steps` steps on the same batches, the variants taking turns step by step (in a rotating order) so the machine's
other load falls on all alike. Variants: whole rows and `trainer.shared_prefix=true`; with `--unfused` also both with
`optimizer.fused=false`; with `--layouts` also the shared prefix in each layout alone (`packed`: one forward of
packed sequences; `cached`: the prefixes, then the rests on their KV cache; by default the plan picks the cheaper per
micro-batch); with `--freed-memory` also both in a process whose heap hands freed memory back to the kernel (glibc's
own thresholds: `runtime.keep_freed_memory=false`; the trainers otherwise keep it, as a training rank does by
default); with `--compile` also both with the trainer's model compiled (`torch.compile(dynamic=True)` of its
decoder; the first steps compile and recompile, tens of seconds on CPU: give `--warmup` 8 or more); with
`--baseline PATH` also both with the agentrl checkout at PATH (its own defaults: the code before a change, e.g. a
`git worktree` of main). Each checkout's trainers run in a child process of their own (this one's too,
one per heap setting), which the parent asks for one step at a time; only one computes at any moment.
Batches have the shapes of benchmarks/vs_trl.py's tasks, 8 groups x 8 episodes, random tokens:
- `digit`: a 14-token prompt, then 2 generated tokens (16 tokens, as the digit task's episodes);
- `guess`: a 25-token prompt, then 1-4 turns of a guess, eos and a 12-token reply (up to 77 tokens).
Per shape and variant: the median wall and CPU milliseconds of `train_step` (forward, backward, clipping, AdamW),
its median page faults (minor: fresh pages the kernel zeroes), the first variant's CPU over this one's, and the share
of positions the shared forward computes (`train/shared_prefix_positions`).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GROUPS, GROUP_SIZE, VOCAB = 8, 8, 128
SHAPES = {"digit": (14, 1, 2, 0), "guess": (25, 4, 1, 12)}  # prompt, most turns, reply tokens, observation tokens


def batch(shape: str, rng: np.random.Generator, vocab: int) -> dict[str, np.ndarray]:
    from agentrl.trajectory import Episode, pack

    prompt_len, most_turns, reply_len, observation_len = SHAPES[shape]
    episodes = []
    for group in range(GROUPS):
        prompt = rng.integers(3, vocab, size=prompt_len)
        for _ in range(GROUP_SIZE):
            episode = Episode(group=group, task_seed=group)
            episode.extend(prompt, mask=0)
            for _ in range(int(rng.integers(1, most_turns + 1))):
                episode.extend(rng.integers(3, vocab, size=reply_len), mask=1, logprobs=np.full(reply_len, -4.0))
                if observation_len:
                    episode.extend([2], mask=0)
                    episode.extend(rng.integers(3, vocab, size=observation_len), mask=0)
            episode.reward = float(rng.random())
            episodes.append(episode)
    return pack(episodes)


def worker(checkout: str, model: str, threads: int, keep: bool) -> None:
    """A child process: trainers of the agentrl at `checkout`, one train step per request on stdin (JSON lines);
    `keep`: its heap keeps freed memory, where that checkout can (runtime.keep_freed_memory)."""
    sys.path.insert(0, checkout)
    answers, sys.stdout = sys.stdout, sys.stderr  # stdout carries the answers only
    if keep:
        try:
            from agentrl.run.freed_memory import keep_freed_memory
        except ImportError:  # a checkout from before the setting
            pass
        else:
            keep_freed_memory()
    import torch

    from agentrl.config import from_dict
    from agentrl.roles.trainer_parts import policy_trainer

    torch.set_num_threads(threads)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    trainers = {}
    for line in sys.stdin:
        request = json.loads(line)
        if "build" in request:  # {"build": name, "shared": bool, "optimizer": {...}}
            config = from_dict(
                {
                    "model": {"path": model},
                    "trainer": {"micro_batch_size": GROUPS * GROUP_SIZE, "shared_prefix": request["shared"]},
                    "optimizer": {"lr": 5e-3, **request["optimizer"]},
                    "rollout": {"group_size": GROUP_SIZE},
                }
            )
            trainers[request["build"]] = policy_trainer(config, model, "cpu")
            if request.get("layouts"):
                trainers[request["build"]].prefix_layouts = tuple(request["layouts"])
            if request.get("compile"):
                decoder = trainers[request["build"]].model.model
                decoder.forward = torch.compile(decoder.forward, dynamic=True)
            answer = {"built": request["build"]}
        else:  # {"step": seed, "shape": name, "trainer": name}
            data = batch(request["shape"], np.random.default_rng(request["step"]), vocab)
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            wall, cpu = time.perf_counter(), time.process_time()
            metrics = trainers[request["trainer"]].train_step(data)
            answer = {
                "wall": time.perf_counter() - wall,
                "cpu": time.process_time() - cpu,
                "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                "positions": metrics.get("train/shared_prefix_positions", 1.0),
            }
        print(json.dumps(answer), file=answers, flush=True)


class Worker:
    """The parent's handle on a child process running `worker` for one checkout."""

    def __init__(self, checkout: str, model: str, threads: int, keep: bool):
        command = [sys.executable, __file__, "--worker", checkout, "--model", model, "--threads", str(threads)]
        command += [] if keep else ["--hand-back"]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the benchmark's worker for {request} exited with {self.process.wait()}")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def variants(
    baseline: str | None, unfused: bool, layouts: bool, freed: bool, compiled: bool = False
) -> list[tuple[str, tuple[str, bool], bool, dict, list, bool]]:
    """(name, (checkout, heap keeps freed memory), shared_prefix, optimizer options, the layouts the plan may take,
    model compiled) of every variant measured."""
    out = []
    checkouts = ([("baseline", baseline)] if baseline else []) + [("this", str(REPO))]
    for label, checkout in checkouts:
        for shared in (False, True):
            kinds = [("", {}, [], True, False)]
            if label == "this" and unfused:
                kinds.append((", optimizer.fused=false", {"fused": False}, [], True, False))
            if label == "this" and shared and layouts:
                kinds += [(f", {name} only", {}, [name], True, False) for name in ("packed", "cached")]
            if label == "this" and freed:
                kinds.append((", runtime.keep_freed_memory=false", {}, [], False, False))
            if label == "this" and compiled:
                kinds.append((", torch.compile", {}, [], True, True))
            for suffix, optimizer, only, keep, compile_model in kinds:
                rows = "shared_prefix" if shared else "whole rows"
                out.append((f"{label}: {rows}{suffix}", (checkout, keep), shared, optimizer, only, compile_model))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="train steps each way, per shape")
    parser.add_argument("--warmup", type=int, default=3, help="steps each way left out of the medians")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--baseline", help="another agentrl checkout to measure beside this one (e.g. main's)")
    parser.add_argument("--unfused", action="store_true", help="also this checkout with optimizer.fused=false")
    parser.add_argument("--layouts", action="store_true", help="also the shared prefix in each layout alone")
    parser.add_argument("--freed-memory", action="store_true", help="also with runtime.keep_freed_memory=false")
    parser.add_argument("--compile", action="store_true", help="also with the trainer's model torch.compile'd")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--hand-back", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.threads, keep=not args.hand_back)
        return
    if args.baseline and not (Path(args.baseline) / "agentrl").is_dir():
        parser.error(f"--baseline {args.baseline} holds no agentrl package: pass an agentrl checkout's root")
    sys.path.insert(0, str(REPO))
    from agentrl.models.tiny import TinyShape, build_tiny_model

    baseline = str(Path(args.baseline).resolve()) if args.baseline else None
    measured = variants(baseline, args.unfused, args.layouts, args.freed_memory, args.compile)
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model"
        shape = TinyShape(hidden_size=64, num_layers=2, num_heads=4, vocab_size=VOCAB, init_std=0.1)
        build_tiny_model(model, ["0 1 2 3 4 5 6 7 8 9"], shape)
        workers = {process: Worker(process[0], str(model), args.threads, process[1]) for _, process, *_ in measured}
        try:
            print(
                "| batch | variant | train_step ms (wall) | CPU ms | page faults | positions computed "
                "| x (CPU, vs the first) |"
            )
            print("|---|---|---|---|---|---|---|")
            for shape in args.shapes:
                for name, process, shared, optimizer, only, compile_model in measured:
                    request = {"build": f"{shape} {name}", "shared": shared, "optimizer": optimizer, "layouts": only}
                    request["compile"] = compile_model
                    workers[process].ask(request)
                timings = {name: [] for name, *_ in measured}
                positions = {name: 1.0 for name, *_ in measured}
                for step in range(args.steps + args.warmup):
                    turn = step % len(measured)
                    for name, process, *_ in measured[turn:] + measured[:turn]:
                        request = {"step": step, "shape": shape, "trainer": f"{shape} {name}"}
                        answer = workers[process].ask(request)
                        if step >= args.warmup:
                            timings[name].append((answer["wall"], answer["cpu"], answer["faults"]))
                        positions[name] = answer["positions"]
                medians = {k: [statistics.median(t[i] for t in v) for i in (0, 1, 2)] for k, v in timings.items()}
                first = medians[measured[0][0]][1]
                for name, *_ in measured:
                    wall, cpu, faults = medians[name]
                    print(
                        f"| {shape} | {name} | {1000 * wall:.1f} | {1000 * cpu:.1f} | {faults:.0f} "
                        f"| {positions[name]:.2f} | {first / cpu:.2f} |"
                    )
        finally:
            for each in workers.values():
                each.close()


if __name__ == "__main__":
    main()
