"""A train step's peak memory and CPU with a real model's vocabulary: what computing logits only at the trained
positions saves on multi-turn episodes.

    python benchmarks/trained_positions_memory.py                          # vocabularies 128 and 151,936
    python benchmarks/trained_positions_memory.py --baseline ../wt0        # the same with another checkout's agentrl
    python benchmarks/trained_positions_memory.py --vocab 32000 151936 --steps 4

The model is the quickstart's shape (hidden 64, 2 layers, 4 heads) with its embedding and LM head resized to
`--vocab` (Qwen2/Qwen3's vocabulary is 151,936, Llama 3's 128,256): the vocabulary alone then decides the logits'
size. Each batch is 8 groups x 8 game-like episodes (a 40-token prompt shared by the group, then 1-4 turns of one
trained token and a 13-token reply: 55-95 tokens, 1-4 trained), random token ids, one micro-batch. Each (checkout,
vocabulary, layout) runs in a fresh process of its own: whole rows and `trainer.shared_prefix=true`. Printed: the
process's peak RSS over what it held before the first step, and the median CPU milliseconds of `train_step` (the
first step left out).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {"whole rows": False, "shared prefix": True}


def batch(rng):
    import numpy as np

    from agentrl.trajectory import Episode, pack

    episodes = []
    for group in range(8):
        prompt = rng.integers(3, 90, size=40)
        for _ in range(8):
            episode = Episode(group=group, task_seed=group)
            episode.extend(prompt, mask=0)
            for _ in range(int(rng.integers(1, 5))):
                episode.extend(rng.integers(3, 90, size=1), mask=1, logprobs=np.full(1, -4.0))
                episode.extend(rng.integers(3, 90, size=13), mask=0)
            episode.reward = float(rng.normal())
            episodes.append(episode)
    return pack(episodes)


def model_folder(vocab: int, work: Path) -> Path:
    """The quickstart's shape with `vocab` rows of embedding and LM head (built once)."""
    from transformers import AutoModelForCausalLM

    from agentrl.models.tiny import TinyShape, build_tiny_model

    path = work / f"vocab{vocab}"
    if not (path / "config.json").exists():
        build_tiny_model(path, ["guess a number between 1 and 7", "higher", "lower"], TinyShape())
        model = AutoModelForCausalLM.from_pretrained(path)
        model.resize_token_embeddings(vocab, mean_resizing=False)
        model.save_pretrained(path)
    return path


def child(args) -> None:
    """One process: load the trainer, train `--steps` steps, print its numbers as JSON."""
    import numpy as np
    import torch

    from agentrl.config import from_dict
    from agentrl.roles.trainer_parts import policy_trainer

    torch.set_num_threads(1)
    model = str(model_folder(args.vocab, Path(args.work)))
    config = from_dict(
        {
            "model": {"path": model},
            "trainer": {"micro_batch_size": 64, "shared_prefix": args.shared},
            "optimizer": {"lr": 1e-3},
            "rollout": {"group_size": 8},
        }
    )
    trainer = policy_trainer(config, model, "cpu")
    rng = np.random.default_rng(0)
    batches = [batch(rng) for _ in range(args.steps)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = []
    for step_batch in batches:
        started = time.process_time()
        trainer.train_step(step_batch)
        seconds.append(time.process_time() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mib": (peak - before) / 1024, "cpu_ms": statistics.median(seconds[1:]) * 1000}))


def run(checkout: Path, vocab: int, shared: bool, steps: int, work: Path) -> dict:
    command = [sys.executable, __file__, "--child", "--vocab", str(vocab), "--steps", str(steps), "--work", str(work)]
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([*command, *(["--shared"] if shared else [])], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{checkout} vocab {vocab}: the step failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[128, 151936])
    parser.add_argument("--steps", type=int, default=4, help="train steps a process (the first is not timed)")
    parser.add_argument("--baseline", type=Path, help="another agentrl checkout, run the same way")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(argparse.Namespace(**{**vars(args), "vocab": args.vocab[0]}))
        return
    checkouts = {"this checkout": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    print("| vocabulary | layout | checkout | peak RSS over the start, MiB | train step CPU ms |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for vocab in args.vocab:
            for layout, shared in LAYOUTS.items():
                for name, checkout in checkouts.items():
                    got = run(checkout, vocab, shared, args.steps, Path(work))
                    numbers = f"{got['peak_mib']:.0f} | {got['cpu_ms']:.0f}"
                    print(f"| {vocab:,} | {layout} | {name} | {numbers} |", flush=True)


if __name__ == "__main__":
    main()
