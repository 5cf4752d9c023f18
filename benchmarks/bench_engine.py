"""Sampling throughput: TorchEngine vs Hugging Face `model.generate`, same model, same prompts.

    python benchmarks/bench_engine.py --batch-sizes 16,32,64 --new-tokens 64 --repeats 5

Builds a tiny random Qwen2 (hidden 256, 4 layers, 8 heads: about 4M parameters) into a
temporary directory and loads it back with `from_pretrained`. For each batch size it
times (a) `model.generate(do_sample=True, max_new_tokens=N, min_new_tokens=N)` on the
left-padded batch and (b) one `TorchEngine.generate` per prompt awaited together, with
no stop ids, so both produce exactly N tokens per row. Every repeat times both, in
alternating order; the table reports median tokens/s of each and their ratio
(engine / generate). Both apply the same top-k/top-p (top_k=50 is generate's default).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.models.tiny import build_tiny_model
from agentrl.rollout.engine import SamplingParams
from agentrl.rollout.torch_engine import TorchEngine

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "An agent reads the observation and then decides what to do next.",
    "Guess a number between 1 and 100; the host answers higher or lower.",
    "12 + 30 = 42, 7 * 8 = 56, 99 - 17 = 82",
    "Reinforcement learning improves the policy from its own samples.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="16,32,64", help="comma-separated batch sizes")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=50, help="applied by both (50 is generate's default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="applied by both")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads")
    return parser.parse_args()


def make_prompts(tokenizer, batch_size: int) -> list[list[int]]:
    """Prompts of 4 to 16 tokens, so the batch needs left padding."""
    encoded = [tokenizer(text)["input_ids"] for text in TEXTS]
    return [encoded[row % len(encoded)][: 4 + row % 13] for row in range(batch_size)]


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return input_ids, attention_mask


def time_hf_generate(model, prompts, pad_id: int, args) -> float:
    input_ids, attention_mask = left_pad(prompts, pad_id)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            temperature=1.0,
            top_k=args.top_k,
            top_p=args.top_p,
            pad_token_id=pad_id,
        )
    elapsed = time.perf_counter() - start
    assert out.shape[1] - input_ids.shape[1] == args.new_tokens
    return elapsed


def time_engine(engine, loop, prompts, args) -> float:
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, top_k=args.top_k, top_p=args.top_p)

    async def run_all():
        return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))

    batches_before = engine.stats["batches"]
    start = time.perf_counter()
    outputs = loop.run_until_complete(run_all())
    elapsed = time.perf_counter() - start
    assert all(len(o.output_ids) == args.new_tokens for o in outputs)
    assert engine.stats["batches"] == batches_before + 1, "the engine should serve the prompts as one batch"
    return elapsed


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model", TEXTS, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads
        )
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad_id = tokenizer.pad_token_id
    engine = TorchEngine(model, pad_token_id=pad_id, max_batch_size=max(1024, *map(int, args.batch_sizes.split(","))))
    loop = asyncio.new_event_loop()

    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Qwen2 hidden={args.hidden} layers={args.layers} heads={args.heads} vocab={model.config.vocab_size} "
        f"params={params / 1e6:.2f}M dtype={model.dtype}; threads={torch.get_num_threads()}; "
        f"new_tokens={args.new_tokens} top_k={args.top_k} top_p={args.top_p}; median of {args.repeats} repeats"
    )
    print(f"{'batch':>5} | {'generate tok/s':>14} | {'engine tok/s':>12} | {'ratio':>5}")
    print(f"{'-' * 5}-+-{'-' * 14}-+-{'-' * 12}-+-{'-' * 5}")
    for batch_size in map(int, args.batch_sizes.split(",")):
        prompts = make_prompts(tokenizer, batch_size)
        time_hf_generate(model, prompts, pad_id, args)  # warm-up
        time_engine(engine, loop, prompts, args)
        hf_times, engine_times = [], []
        for repeat in range(args.repeats):
            # Alternate which goes first, so neither always runs in the other's wake.
            if repeat % 2 == 0:
                hf_times.append(time_hf_generate(model, prompts, pad_id, args))
                engine_times.append(time_engine(engine, loop, prompts, args))
            else:
                engine_times.append(time_engine(engine, loop, prompts, args))
                hf_times.append(time_hf_generate(model, prompts, pad_id, args))
        tokens = batch_size * args.new_tokens
        hf_rate = tokens / statistics.median(hf_times)
        engine_rate = tokens / statistics.median(engine_times)
        print(f"{batch_size:>5} | {hf_rate:>14.0f} | {engine_rate:>12.0f} | {engine_rate / hf_rate:>5.2f}", flush=True)
    loop.close()
    engine.shutdown()


if __name__ == "__main__":
    main()
