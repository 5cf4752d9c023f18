"""GPU smoke check and numbers for the torch path: a GRPO step, a colocated CUDA IPC weight update,
engine-vs-trainer logprobs after the update, and engine tokens/s vs `model.generate`.

    python benchmarks/gpu_check.py                     # on a GPU node: a ~0.5B Qwen2, random weights
    python benchmarks/gpu_check.py --device cpu --small  # dry run of everything but the CUDA-only parts

The model is built locally (no downloads): a Qwen2 config of Qwen2.5-0.5B's shape (hidden
896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151,936) with random
weights in bfloat16, and agentrl's tiny byte-level tokenizer (token ids are all it needs).
The weight update runs under `mpirun -n 2`: rank 0 holds the trainer's model, rank 1 a
TorchEngine on the same GPU; `CUDAIPCWeightSync` moves the weights (on CPU the dry run
uses `MPIWeightBroadcast` instead). Its GB/s is compared with one device-to-device copy
of the same bytes. Then rank 1 generates greedily from a fixed prompt and rank 0 scores
those tokens with its own model: equal weights give equal logprobs up to kernel noise.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
FULL_SHAPE = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
)
SMALL_SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=512,
)
TOKENIZER_TEXTS = ["the agent calls a tool and reads the answer", "0 1 2 3 4 5 6 7 8 9 + - * / = ( )"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--small", action="store_true", help="a tiny model instead of the ~0.5B one")
    parser.add_argument("--batch-sizes", default="32,64", help="engine vs generate batch sizes")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--weight-sync-part", metavar="MODEL_DIR", help=argparse.SUPPRESS)  # the mpirun child
    return parser.parse_args(argv)


def build_model(out_dir: Path, small: bool, dtype: torch.dtype) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(TOKENIZER_TEXTS, vocab_size=160)
    config = Qwen2Config(
        **(SMALL_SHAPE if small else FULL_SHAPE),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        torch_dtype=str(dtype).removeprefix("torch."),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def agentrl_config(model_dir: Path, dtype: str):
    from agentrl.config import load_config

    return load_config(None, [f"model.path={model_dir}", f"model.dtype={dtype}", "steps=10"])


def random_batch(vocab: int, episodes: int, prompt_len: int, response_len: int, seed: int = 0) -> dict:
    from agentrl.trajectory import Episode, pack

    rng = np.random.default_rng(seed)
    batch = []
    for index in range(episodes):
        episode = Episode(group=index // 4, task_seed=index, reward=float(rng.random()), finish="terminated")
        episode.extend(rng.integers(3, vocab, prompt_len), mask=0)
        episode.extend(rng.integers(3, vocab, response_len), mask=1, logprobs=np.full(response_len, -2.0))
        episode.prompt_len = prompt_len
        batch.append(episode)
    return pack(batch)


def sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def time_grpo_step(model_dir: Path, device: str, dtype: str, small: bool) -> dict:
    from agentrl.trainer.policy_trainer import PolicyTrainer

    trainer = PolicyTrainer(agentrl_config(model_dir, dtype), str(model_dir), device)
    episodes, prompt_len, response_len = (8, 16, 16) if small else (32, 256, 512)
    batch = random_batch(160, episodes, prompt_len, response_len)
    trainer.train_step(batch)  # warm-up: allocator, kernels
    sync_device(device)
    started = time.perf_counter()
    metrics = trainer.train_step(batch)
    sync_device(device)
    seconds = time.perf_counter() - started
    tokens = episodes * (prompt_len + response_len)
    params = sum(p.numel() for p in trainer.model.parameters())
    return {"params": params, "seconds": seconds, "tokens_per_s": tokens / seconds, "loss": metrics["train/loss"]}


# ---- the two-process part (run under mpirun -n 2) ------------------------------------


def weight_sync_part(model_dir: Path, device: str, dtype: str, bucket_mb: float) -> None:
    from mpi4py import MPI

    from agentrl import transport
    from agentrl.rollout.engine import SamplingParams
    from agentrl.rollout.torch_engine import TorchEngine
    from agentrl.trainer.model import load_causal_lm
    from agentrl.weights import MPIWeightBroadcast
    from agentrl.weights_gpu import CUDAIPCWeightSync

    world = MPI.COMM_WORLD
    model = load_causal_lm(str(model_dir), dtype, device)
    on_gpu = device.startswith("cuda")
    sync = CUDAIPCWeightSync(world, bucket_mb, device) if on_gpu else MPIWeightBroadcast(world, bucket_mb)
    prompt = list(range(5, 37))
    if world.Get_rank() == 0:
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(1.01)  # "trained": the engine must pick this up
        named = [(name, p.detach()) for name, p in model.named_parameters()]
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        sync.send(named, 1)  # warm-up (IPC handles, allocator)
        sync_device(device)
        started = time.perf_counter()
        sync.send(named, 2)
        sync_device(device)
        seconds = time.perf_counter() - started
        copy_seconds = device_copy_seconds(named, device)
        generated = transport.bcast_object(world, None, root=1)
        diffs = np.abs(trainer_logprobs(model, prompt, generated["ids"], device) - generated["logprobs"])
        sync.stop()
        print(
            "WEIGHT_SYNC_RESULT "
            + json.dumps(
                {
                    "method": "cuda_ipc" if on_gpu else "mpi (cpu dry run)",
                    "gb": nbytes / 1e9,
                    "seconds": seconds,
                    "copy_seconds": copy_seconds,
                    "version": generated["version"],
                    "max_abs_diff": float(diffs.max()),
                    "mean_abs_diff": float(diffs.mean()),
                }
            ),
            flush=True,
        )
    else:
        engine = TorchEngine(model, pad_token_id=0)
        versions = [sync.receive(engine), sync.receive(engine)]
        assert versions == [1, 2], versions
        greedy = SamplingParams(max_new_tokens=32, temperature=1.0, top_k=1)
        output = asyncio.run(engine.generate(prompt, greedy))
        payload = {"ids": output.output_ids.tolist(), "logprobs": output.logprobs, "version": engine.weight_version}
        transport.bcast_object(world, payload, root=1)
        assert sync.receive(engine) is None
        engine.shutdown()


def device_copy_seconds(named, device: str) -> float:
    """One device-to-device copy of the same bytes, the bound a same-GPU update cannot beat."""
    source = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in named])
    target = torch.empty_like(source)
    target.copy_(source)
    sync_device(device)
    started = time.perf_counter()
    target.copy_(source)
    sync_device(device)
    return time.perf_counter() - started


@torch.no_grad()
def trainer_logprobs(model, prompt: list[int], generated: list[int], device: str) -> np.ndarray:
    ids = torch.tensor([prompt + generated], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = torch.tensor(generated, device=device)
    return torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None]).squeeze(1).cpu().numpy()


def run_weight_sync_part(model_dir: Path, args) -> dict:
    from tests.conftest import mpirun_command

    command = [
        *mpirun_command(2),
        sys.executable,
        str(Path(__file__).resolve()),
        "--weight-sync-part",
        str(model_dir),
        "--device",
        args.device,
        "--bucket-mb",
        str(args.bucket_mb),
        *(["--small"] if args.small else []),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    for line in done.stdout.splitlines():
        if line.startswith("WEIGHT_SYNC_RESULT "):
            return json.loads(line.removeprefix("WEIGHT_SYNC_RESULT "))
    raise RuntimeError(f"the mpirun weight-sync part failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


# ---- engine throughput -------------------------------------------------------------


def time_generation(model_dir: Path, device: str, dtype: str, batch_size: int, new_tokens: int) -> dict:
    from agentrl.rollout.engine import SamplingParams
    from agentrl.rollout.torch_engine import TorchEngine
    from agentrl.trainer.model import load_causal_lm

    model = load_causal_lm(str(model_dir), dtype, device).eval()
    rng = np.random.default_rng(batch_size)
    prompts = [rng.integers(3, 160, 64).tolist() for _ in range(batch_size)]
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_k=50)
    engine = TorchEngine(model, pad_token_id=0, max_batch_size=batch_size, seed=0)

    async def all_prompts():
        return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))

    asyncio.run(all_prompts())  # warm-up
    sync_device(device)
    started = time.perf_counter()
    outputs = asyncio.run(all_prompts())
    sync_device(device)
    engine_seconds = time.perf_counter() - started
    engine_tokens = sum(len(o.output_ids) for o in outputs)
    engine.shutdown()

    input_ids = torch.tensor(prompts, device=device)
    generate_kwargs = dict(
        do_sample=True, top_k=50, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0
    )
    with torch.inference_mode():
        model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **generate_kwargs)
        sync_device(device)
        started = time.perf_counter()
        generated = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **generate_kwargs)
        sync_device(device)
    generate_seconds = time.perf_counter() - started
    generate_tokens = (generated.shape[1] - input_ids.shape[1]) * batch_size
    return {"engine": engine_tokens / engine_seconds, "generate": generate_tokens / generate_seconds}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here; run it on a GPU node, or dry-run the non-CUDA logic with "
            "`python benchmarks/gpu_check.py --device cpu --small`",
            file=sys.stderr,
        )
        return 2
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    if args.weight_sync_part:
        weight_sync_part(Path(args.weight_sync_part), _rank_device(args.device), dtype, args.bucket_mb)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-"))
    try:
        model_dir = build_model(workdir / "model", args.small, getattr(torch, dtype))
        rows = [f"| device | {torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'} |"]
        step = time_grpo_step(model_dir, args.device, dtype, args.small)
        rows.append(f"| model parameters | {step['params'] / 1e6:.1f} M ({dtype}) |")
        rows.append(f"| GRPO train step | {step['seconds']:.3f} s, {step['tokens_per_s']:.0f} tokens/s |")
        sync = run_weight_sync_part(model_dir, args)
        rows.append(
            f"| weight update ({sync['method']}, {sync['gb']:.3f} GB) | {sync['seconds']:.3f} s, "
            f"{sync['gb'] / sync['seconds']:.2f} GB/s |"
        )
        rows.append(
            f"| device copy of the same bytes | {sync['copy_seconds']:.4f} s, "
            f"{sync['gb'] / sync['copy_seconds']:.2f} GB/s |"
        )
        rows.append(f"| engine weight version after update | {sync['version']} |")
        rows.append(
            f"| engine vs trainer logprobs, abs diff | max {sync['max_abs_diff']:.2e}, "
            f"mean {sync['mean_abs_diff']:.2e} |"
        )
        new_tokens = 8 if args.small else args.new_tokens
        for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
            speed = time_generation(model_dir, args.device, dtype, batch_size, new_tokens)
            rows.append(
                f"| tokens/s at batch {batch_size} ({new_tokens} new) | engine {speed['engine']:.0f}, "
                f"generate {speed['generate']:.0f} ({speed['engine'] / speed['generate']:.2f}x) |"
            )
        print("| check | result |\n|---|---|\n" + "\n".join(rows))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _rank_device(device: str) -> str:
    """Both mpirun ranks on one GPU: the colocated case."""
    return "cuda:0" if device.startswith("cuda") else device


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
