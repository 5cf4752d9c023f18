"""What `trainer.shared_prefix` saves in a train step: the same batch trained with and without, alternately.

    python benchmarks/shared_prefix_cost.py                 # the digit and guess batch shapes, 40 steps each way
    python benchmarks/shared_prefix_cost.py --steps 20 --threads 2

Two PolicyTrainers load the quickstart's tiny model shape (hidden 64, 2 layers, vocab 128), one with the option;
each trains `--steps` steps on the same batches, the two taking turns step by step so the machine's other load falls
on both alike. Batches have the shapes of benchmarks/vs_trl.py's tasks, 8 groups x 8 episodes, random tokens:
- `digit`: a 14-token prompt, then 2 generated tokens (16 tokens, as the digit task's episodes);
- `guess`: a 25-token prompt, then 1-4 turns of a guess, eos and a 12-token reply (up to 77 tokens).
Per shape: the median wall and CPU milliseconds of `train_step` (forward, backward, clipping, AdamW), their ratio,
and the share of positions the shared forward computes (`train/shared_prefix_positions`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentrl.config import from_dict  # noqa: E402
from agentrl.models.tiny import TinyShape, build_tiny_model  # noqa: E402
from agentrl.roles.trainer_parts import policy_trainer  # noqa: E402
from agentrl.trajectory import Episode, pack  # noqa: E402

GROUPS, GROUP_SIZE, VOCAB = 8, 8, 128
SHAPES = {"digit": (14, 1, 2, 0), "guess": (25, 4, 1, 12)}  # prompt, most turns, reply tokens, observation tokens


def batch(shape: str, rng: np.random.Generator, vocab: int) -> dict[str, np.ndarray]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="train steps each way, per shape")
    parser.add_argument("--warmup", type=int, default=3, help="steps each way left out of the medians")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model"
        shape = TinyShape(hidden_size=64, num_layers=2, num_heads=4, vocab_size=VOCAB, init_std=0.1)
        build_tiny_model(model, ["0 1 2 3 4 5 6 7 8 9"], shape)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]  # the tokenizer's, up to VOCAB
        print("| batch | shared_prefix | train_step ms (wall) | CPU ms | positions computed | x (CPU) |")
        print("|---|---|---|---|---|---|")
        for shape in args.shapes:
            trainers = {}
            for shared in (False, True):
                config = from_dict(
                    {
                        "model": {"path": str(model)},
                        "trainer": {"micro_batch_size": GROUPS * GROUP_SIZE, "shared_prefix": shared},
                        "optimizer": {"lr": 5e-3},
                        "rollout": {"group_size": GROUP_SIZE},
                    }
                )
                trainers[shared] = policy_trainer(config, str(model), "cpu")
            rng = np.random.default_rng(0)
            timings = {False: [], True: []}
            positions = 1.0
            for step in range(args.steps + args.warmup):
                data = batch(shape, rng, vocab)
                for shared in (False, True) if step % 2 else (True, False):
                    wall, cpu = time.perf_counter(), time.process_time()
                    metrics = trainers[shared].train_step(data)
                    if step >= args.warmup:
                        timings[shared].append((time.perf_counter() - wall, time.process_time() - cpu))
                    positions = metrics.get("train/shared_prefix_positions", positions)
            medians = {k: [1000 * statistics.median(t[i] for t in v) for i in (0, 1)] for k, v in timings.items()}
            for shared in (False, True):
                wall, cpu = medians[shared]
                share = f"{positions:.2f}" if shared else "1.00"
                ratio = medians[False][1] / cpu
                print(f"| {shape} | {str(shared).lower()} | {wall:.1f} | {cpu:.1f} | {share} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
