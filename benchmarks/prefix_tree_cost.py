"""What the prefix tree layout of `trainer.shared_prefix` saves on real multi-turn batches (issue 53).

    python benchmarks/prefix_tree_cost.py                         # the game (vs_trl's guess config), 30 steps
    python benchmarks/prefix_tree_cost.py --steps 30 --timed 5 20 29 --repeats 7
    python benchmarks/prefix_tree_cost.py --end-to-end 60         # also: agentrl train with the tree allowed or not

`record`: trains the game for `--steps` steps in a child process (one process, 1 torch thread,
`trainer.shared_prefix`) and keeps every batch the trainer got. Then, per step, the positions each layout computes
over the sum of the episodes' lengths (the longest common prefix per group, a prefix tree per group, one tree of all
the rows), and for the `--timed` steps the forward + backward of the batch (a log-softmax summed as the loss; medians
of `--repeats`) in whole rows, in the layout `plan` picks without the tree, and with the tree alone. With
`--end-to-end N`: `agentrl train` of the same config for N steps, the tree allowed and not, alternating twice, each
in a child process: median s/step over steps 10 on, the train phase, and the last 10 steps' mean reward.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import vs_trl  # noqa: E402

CHILD = """
import pickle, sys
import numpy as np
from agentrl.trainer import policy_trainer, shared_prefix
mode, out = sys.argv[1], sys.argv[2]
if mode == "no-tree":
    allowed = shared_prefix.check_model
    shared_prefix.check_model = lambda model: tuple(name for name in allowed(model) if name != "tree")
if mode == "record":
    kept, train_step = [], policy_trainer.PolicyTrainer.train_step
    def keeping(self, batch):
        kept.append({key: np.array(batch[key]) for key in ("tokens", "offsets", "group")})
        return train_step(self, batch)
    policy_trainer.PolicyTrainer.train_step = keeping
from agentrl.cli import main
code = main(sys.argv[3:])
if mode == "record":
    pickle.dump(kept, open(out, "wb"))
sys.exit(code)
"""


def train(mode: str, config: Path, steps: int, run_dir: Path, out: Path) -> None:
    command = [sys.executable, "-c", CHILD, mode, str(out), "train", str(config), f"steps={steps}", "seed=0",
               f"run_dir={run_dir}", "runtime.torch_threads=1", "trainer.shared_prefix=true"]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PATH": str(Path(sys.executable).parent)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rows(batch: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batch's episodes as the trainer lays them out (right-padded ids, lengths), and each one's group."""
    import torch

    from agentrl.trainer.policy_trainer import _rows

    ids, _, lengths = _rows(batch, np.arange(len(batch["offsets"]) - 1), "tokens", torch.long)
    return ids.numpy(), np.asarray(lengths), np.unique(batch["group"], return_inverse=True)[1].reshape(-1)


def distinct_prefixes(ids: np.ndarray, lengths: np.ndarray, owner: np.ndarray) -> tuple[int, int, int]:
    """(positions with each group's longest common prefix once, nodes of each group's prefix tree, nodes of one
    tree of all the rows)."""
    from agentrl.trainer import prefix_tree, shared_prefix

    _, shared = shared_prefix.common_prefixes(ids, lengths, owner)
    common = int(shared.sum() + (lengths - shared[owner]).sum())
    one = int(prefix_tree.grow(ids, lengths, np.zeros_like(owner)).nodes.sum())
    return common, int(prefix_tree.grow(ids, lengths, owner).nodes.sum()), one


def timed(model, ids, lengths, owner, layouts, repeats: int) -> tuple[int, float]:
    import torch

    from agentrl.trainer import shared_prefix

    found = shared_prefix.plan(ids, lengths, owner, shared_prefix.pair_cost(model), layouts) if layouts else None
    tokens = torch.from_numpy(ids)
    attention = (torch.arange(ids.shape[1])[None] < torch.from_numpy(lengths)[:, None]).long()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        if found is None:
            flat = model(input_ids=tokens, attention_mask=attention, use_cache=False).logits.flatten(0, 1)
        else:
            flat, _ = shared_prefix.position_logits(model, tokens, shared_prefix.prepare(ids, lengths, found))
        flat.log_softmax(-1)[:, 5].sum().backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    positions = ids.size if found is None else found.positions
    if found is None:
        kind = "whole rows"
    else:
        kind = "tree" if found.tree is not None else "cached" if found.cached else "packed"
    return positions, statistics.median(times) * 1e3, kind


def end_to_end(config: Path, steps: int, work: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    print(f"\n| round | tree | s/step (median, steps 10-{steps - 1}) | train s (last 20) | reward, last 10 |")
    print("|---|---|---|---|---|")
    for round_ in (1, 2):
        for mode in ("tree", "no-tree"):
            run_dir = work / f"{mode}-{round_}"
            train(mode, config, steps, run_dir, work / "unused")
            events = EventAccumulator(str(run_dir / "tb"), size_guidance={SCALARS: 0})
            events.Reload()
            values = {tag: [e.value for e in events.Scalars(tag)] for tag in ("time/step", "time/train")}
            reward = [e.value for e in events.Scalars("episode/reward_mean")][-10:]
            step, trained = statistics.median(values["time/step"][10:]), statistics.median(values["time/train"][-20:])
            allowed, reward = "allowed" if mode == "tree" else "not", sum(reward) / len(reward)
            print(f"| {round_} | {allowed} | {step:.4f} | {trained:.4f} | {reward:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timed", type=int, nargs="+", default=[5, 20, 29])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--end-to-end", type=int, default=0, metavar="STEPS")
    parser.add_argument("--work", type=Path, help="a folder for the runs (default: a temporary one)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="prefix-tree-"))
    work.mkdir(parents=True, exist_ok=True)
    config = vs_trl.agentrl_config("guess", work)
    batches = work / "batches.pkl"
    train("record", config, args.steps, work / "record", batches)
    kept = pickle.loads(batches.read_bytes())
    print(f"the game, {len(kept)} steps, seed 0 (`{json.loads(config.read_text())['env']['id']}`, 8 groups x 8)\n")
    print("| step | episodes' tokens | longest common prefix per group | prefix tree per group | one prefix tree |")
    print("|---|---|---|---|---|")
    for step, batch in enumerate(kept):
        ids, lengths, owner = rows(batch)
        common, nodes, one = distinct_prefixes(ids, lengths, owner)
        total = int(lengths.sum())
        print(f"| {step} | {total} | {common / total:.2f} | {nodes / total:.2f} | {one / total:.2f} |")

    model = AutoModelForCausalLM.from_pretrained(work / "model-guess", attn_implementation="sdpa")
    print("\n| step | layout | positions | fwd+bwd ms |")
    print("|---|---|---|---|")
    for step in args.timed:
        ids, lengths, owner = rows(kept[step])
        for layouts in (None, ("packed", "cached"), ("tree",)):
            positions, ms, kind = timed(model, ids, lengths, owner, layouts, args.repeats)
            print(f"| {step} | {kind} | {positions} | {ms:.1f} |", flush=True)
    if args.end_to_end:
        end_to_end(config, args.end_to_end, work)


if __name__ == "__main__":
    main()
