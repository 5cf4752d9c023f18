"""Full fine-tuning vs LoRA (rank 8 and 64): bytes per sync, sync time, trainer memory, step time.

mpirun -n 3 python benchmarks/bench_lora.py [--reps 3] [--sizes quickstart,100m]

Rank 0 is the trainer (agentrl's PolicyTrainer on a randomly initialised Qwen2-shaped model: the quickstart's
size, and about 100M parameters); ranks 1-2 are rollout ranks holding torch engines. Per mode and size:
- bytes/sync: what one weight sync sends (every weight, or only the adapters);
- sync s: median over --reps versions, from the trainer's send until every engine has loaded the version
  (LoRA: merged into its base weights and confirmed by version and checksum), over weights.transport=mpi
  and shm (copied, not mapped);
- trainer MB: parameters + gradients + AdamW state after one step (the frozen base counts as parameters);
- step s: median time of one GRPO step (forward, backward, optimizer) on 4 episodes x 64 tokens.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from agentrl import transport

SIZES = {  # name: Qwen2Config fields
    "quickstart": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 256, "vocab_size": 128},
    "100m": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 6,
             "intermediate_size": 2048, "vocab_size": 32000},
}  # fmt: skip
MODES = {"full": None, "lora r8": 8, "lora r64": 64}


def build(folder: Path, fields: dict) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**fields, max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def config_for(folder: Path, rank: int | None):
    from agentrl.config import from_dict

    model = {"path": str(folder)}
    if rank is not None:
        model["lora"] = {"rank": rank, "alpha": 2 * rank}
    return from_dict({"model": model, "trainer": {"micro_batch_size": 4}, "optimizer": {"lr": 1e-4}, "steps": 100})


def batch(vocab: int) -> dict:
    from agentrl.trajectory import Episode, pack

    rng = np.random.default_rng(0)
    episodes = []
    for i in range(4):
        e = Episode(group=0, task_seed=0, reward=float(i % 2), finish="terminated")
        e.extend([int(t) for t in rng.integers(1, vocab, 32)], mask=0)
        e.extend([int(t) for t in rng.integers(1, vocab, 32)], mask=1)
        episodes.append(e)
    return pack(episodes)


def trainer_memory(trainer) -> int:
    params = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in trainer.model.parameters() if p.grad is not None)
    state = sum(
        t.numel() * t.element_size() for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    )
    return params + grads + state


def make_sync(kind: str, comm, lora: bool):
    from agentrl.weights.lora import ConfirmedAdapterSync
    from agentrl.weights.mpi import MPIWeightBroadcast
    from agentrl.weights.shm import SharedMemoryWeights

    inner = (
        MPIWeightBroadcast(comm, 64.0)
        if kind == "mpi"
        else SharedMemoryWeights(comm, node=0, bucket_mb=64.0, mapped=False, in_place=False)
    )
    return ConfirmedAdapterSync(inner, comm) if lora else inner


def measure(comm, folder: Path, rank: int | None, reps: int, vocab: int) -> dict | None:
    """Every rank: rank 0 trains and sends, the others receive into engines; rank 0 returns the row."""
    from agentrl.engine.torch_engine import TorchEngine
    from agentrl.models.loading import load_causal_lm
    from agentrl.roles.trainer_parts import policy_trainer

    config = config_for(folder, rank)
    row = {}
    if comm.Get_rank() == 0:
        trainer = policy_trainer(config, str(folder), "cpu")
        data = batch(vocab)
        trainer.train_step(data)  # warm-up; also creates gradients and optimizer state
        row["trainer_bytes"] = trainer_memory(trainer)
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            trainer.train_step(data)
            times.append(time.perf_counter() - started)
        row["step_s"] = statistics.median(times)
        named = trainer.named_weights()
        row["sync_bytes"] = sum(t.numel() * t.element_size() for _, t in named)
    else:
        engine = TorchEngine(load_causal_lm(str(folder)), pad_token_id=0)
        if rank is not None:
            engine.use_lora(config.model.lora.scaling)
    for kind in ("mpi", "shm"):
        sync = make_sync(kind, comm, rank is not None)
        times = []
        for version in range(reps + 1):  # the first one allocates buffers and windows: not timed
            transport.barrier(comm)
            started = time.perf_counter()
            if comm.Get_rank() == 0:
                sync.send(named, version)
            else:
                sync.receive(engine)
            transport.barrier(comm)
            if version:
                times.append(time.perf_counter() - started)
        if comm.Get_rank() == 0:
            sync.stop()
            row[f"sync_{kind}_s"] = statistics.median(times)
        else:
            assert sync.receive(engine) is None
    return row if comm.Get_rank() == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", default="quickstart,100m")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench_lora_")) if comm.Get_rank() == 0 else None
    root = Path(comm.bcast(str(root) if root else None, root=0))
    rows = []
    for size in args.sizes.split(","):
        folder = root / size
        params = build(folder, SIZES[size]) if comm.Get_rank() == 0 else None
        params = comm.bcast(params, root=0)
        for mode, rank in MODES.items():
            row = measure(comm, folder, rank, args.reps, SIZES[size]["vocab_size"])
            if row is not None:
                rows.append({"size": f"{size} ({params / 1e6:.1f}M)", "mode": mode, **row})
                print(f"done {size} {mode}", flush=True)
    if comm.Get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)
        print(f"\nmpirun -n {comm.Get_size()}: trainer rank 0, {comm.Get_size() - 1} engines; medians of {args.reps}")
        print("| model | mode | bytes/sync | sync s (mpi) | sync s (shm) | trainer MB (params+grads+AdamW) | step s |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['size']} | {r['mode']} | {r['sync_bytes']:,} | {r['sync_mpi_s']:.4f} | {r['sync_shm_s']:.4f} "
                f"| {r['trainer_bytes'] / 2**20:.1f} | {r['step_s']:.3f} |"
            )


if __name__ == "__main__":
    main()
