"""Sampling throughput: TorchEngine vs Hugging Face `model.generate`, same model, same prompts.

    python benchmarks/bench_engine.py --batch-sizes 16,32,64 --new-tokens 64 --repeats 5

Builds a tiny random Qwen2 (hidden 256, 4 layers, 8 heads: about 4M parameters) into a
temporary directory and loads it back with `from_pretrained`. For each batch size it
times (a) `model.generate(do_sample=True, max_new_tokens=N, min_new_tokens=N)` on the
left-padded batch and (b) one `TorchEngine.generate` per prompt awaited together, with
no stop ids, so both produce exactly N tokens per row. Every repeat times both, in
alternating order; the table reports median tokens/s of each and their ratio
(engine / generate). Both apply the same top-k/top-p (top_k=50 is generate's default).

`--workload ragged` gives each row its own budget of N/8..N new tokens, as turns of
agent episodes have: `generate` stops each row at its budget through a per-row stopping
criterion (finished rows are padded but still computed until the longest is done), the
engine drops a row from the batch when it is done. Only the tokens each row was asked
for count, for both.
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
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList

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
    parser.add_argument("--workload", default="fixed,ragged", help="fixed: N tokens per row; ragged: N/8..N per row")
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


class RowBudgets(StoppingCriteria):
    """Per-row stop: row i is done once it has generated budgets[i] tokens."""

    def __init__(self, prompt_width: int, budgets: list[int]):
        self.prompt_width = prompt_width
        self.budgets = torch.tensor(budgets)

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.prompt_width) >= self.budgets


def row_budgets(batch_size: int, args) -> list[int]:
    if args.current_workload == "fixed":
        return [args.new_tokens] * batch_size
    generator = torch.Generator().manual_seed(batch_size)
    low = max(1, args.new_tokens // 8)
    return torch.randint(low, args.new_tokens + 1, (batch_size,), generator=generator).tolist()


def time_hf_generate(model, prompts, pad_id: int, args) -> float:
    input_ids, attention_mask = left_pad(prompts, pad_id)
    budgets = row_budgets(len(prompts), args)
    stopping = StoppingCriteriaList([RowBudgets(input_ids.shape[1], budgets)])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            max_new_tokens=max(budgets),
            min_new_tokens=min(budgets),
            stopping_criteria=stopping,
            temperature=1.0,
            top_k=args.top_k,
            top_p=args.top_p,
            pad_token_id=pad_id,
        )
    elapsed = time.perf_counter() - start
    assert out.shape[1] - input_ids.shape[1] == max(budgets)
    return elapsed


def sampling(budget: int, args) -> SamplingParams:
    return SamplingParams(max_new_tokens=budget, temperature=1.0, top_k=args.top_k, top_p=args.top_p)


def time_engine(engine, loop, prompts, args) -> float:
    budgets = row_budgets(len(prompts), args)

    async def run_all():
        return await asyncio.gather(
            *(engine.generate(p, sampling(budget, args)) for p, budget in zip(prompts, budgets, strict=True))
        )

    batches_before = engine.stats["batches"]
    start = time.perf_counter()
    outputs = loop.run_until_complete(run_all())
    elapsed = time.perf_counter() - start
    assert [len(o.output_ids) for o in outputs] == budgets
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
    print(f"{'workload':>8} | {'batch':>5} | {'generate tok/s':>14} | {'engine tok/s':>12} | {'ratio':>5}")
    print(f"{'-' * 8}-+-{'-' * 5}-+-{'-' * 14}-+-{'-' * 12}-+-{'-' * 5}")
    for workload, batch_size in (
        (w, b) for w in args.workload.split(",") for b in map(int, args.batch_sizes.split(","))
    ):
        args.current_workload = workload
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
        tokens = sum(row_budgets(batch_size, args))
        hf_rate = tokens / statistics.median(hf_times)
        engine_rate = tokens / statistics.median(engine_times)
        ratio = engine_rate / hf_rate
        print(f"{workload:>8} | {batch_size:>5} | {hf_rate:>14.0f} | {engine_rate:>12.0f} | {ratio:>5.2f}", flush=True)
    loop.close()
    engine.shutdown()


if __name__ == "__main__":
    main()
