"""Sampling throughput: the continuous torch engine vs the batch torch engine vs Hugging Face `model.generate`.

    python benchmarks/bench_engine.py --shapes 64x2x4,256x4x8 --batch-sizes 32 --repeats 5
    python benchmarks/bench_engine.py --device cuda --dtype bfloat16 --shapes 512x8x8   # on a GPU

For each model shape (hidden x layers x heads; a tiny random Qwen2 built into a temporary
directory and loaded back with `from_pretrained`; 64x2x4 is the quickstart's) and each
workload it times, in one run, side by side:

- `generate`: `model.generate(do_sample=True, ...)` on the left-padded batch;
- `batch`: `TorchEngine` (rollout.engine.scheduler=batch): the requests pending together
  run as one batch to completion;
- `continuous`: `ContinuousTorchEngine` (scheduler=continuous): rows join and leave the
  running batch at every step; an episode's KV cache is kept between its turns.

Workloads (no stop ids, so every row produces exactly the tokens it was asked for; only
those count, for all three; every one applies the same top-k/top-p):

- `fixed`: one turn, N new tokens per row.
- `ragged`: one turn, N/8..N new tokens per row. `generate` stops each row at its budget
  through a per-row stopping criterion (finished rows still computed until the longest is
  done); the engines drop a row when it is done.
- `multiturn`: the agentic shape: every row is an episode of T turns (default 8), each
  turn with its own budget of N/8..N tokens, followed by an observation of 8..16 tokens
  appended to the conversation (an env step, optionally taking --env-ms). The engines
  serve one coroutine per episode that awaits `generate` with the whole conversation each
  turn; `generate` runs turn by turn over the episodes' whole conversations.

Every repeat times all three in rotating order; the table reports the median tokens/s of
each, the ratios continuous/generate and continuous/batch of those medians, and the lowest
and highest continuous/batch ratio of single repeats (how far this machine drifts).
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

from agentrl.engine.base import SamplingParams
from agentrl.engine.continuous import ContinuousTorchEngine
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.tiny import TinyShape, build_tiny_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "An agent reads the observation and then decides what to do next.",
    "Guess a number between 1 and 100; the host answers higher or lower.",
    "12 + 30 = 42, 7 * 8 = 56, 99 - 17 = 82",
    "Reinforcement learning improves the policy from its own samples.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
]
CONTENDERS = ("generate", "batch", "continuous")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x2x4,256x4x8", help="model shapes, hidden x layers x heads")
    parser.add_argument("--batch-sizes", default="32", help="comma-separated batch sizes (episodes in multiturn)")
    parser.add_argument("--new-tokens", type=int, default=32, help="N: tokens per row (fixed), most per turn otherwise")
    parser.add_argument("--turns", type=int, default=8, help="turns per episode (multiturn)")
    parser.add_argument("--env-ms", type=float, default=0.0, help="time one env step takes (multiturn)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top-k", type=int, default=50, help="applied by all (50 is generate's default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="applied by all")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads")
    parser.add_argument("--workload", default="fixed,ragged,multiturn", help="fixed, ragged, multiturn")
    parser.add_argument("--device", default="cpu", help="where the model and its tensors live: cpu, cuda, cuda:1")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--vocab",
        type=int,
        default=0,
        help="the model's vocabulary: 0 keeps the tiny tokenizer's 160; a larger one (151936 is Qwen's) resizes "
        "the embedding and LM head (prompts and observations stay within the tokenizer's tokens)",
    )
    return parser.parse_args()


def make_prompts(tokenizer, batch_size: int) -> list[list[int]]:
    """Prompts of 4 to 16 tokens, so the batch needs left padding."""
    encoded = [tokenizer(text)["input_ids"] for text in TEXTS]
    return [encoded[row % len(encoded)][: 4 + row % 13] for row in range(batch_size)]


class Workload:
    """Per-row, per-turn token budgets and observations, the same for every contender."""

    def __init__(self, kind: str, prompts: list[list[int]], tokenizer, args):
        self.kind, self.prompts, self.env_s = kind, prompts, args.env_ms / 1000
        turns = args.turns if kind == "multiturn" else 1
        generator = torch.Generator().manual_seed(len(prompts))
        low = args.new_tokens if kind == "fixed" else max(1, args.new_tokens // 8)
        shape = (len(prompts), turns)
        self.budgets = torch.randint(low, args.new_tokens + 1, shape, generator=generator).tolist()
        vocab = [i for i in range(tokenizer.vocab_size) if i not in tokenizer.all_special_ids]
        lengths = torch.randint(8, 17, shape, generator=generator).tolist()
        self.observations = [
            [[vocab[(row * 31 + turn * 7 + i) % len(vocab)] for i in range(n)] for turn, n in enumerate(row_lengths)]
            for row, row_lengths in enumerate(lengths)
        ]
        self.tokens = sum(map(sum, self.budgets))


class RowBudgets(StoppingCriteria):
    """Per-row stop: row i is done once it has generated budgets[i] tokens."""

    def __init__(self, prompt_width: int, budgets: list[int], device: torch.device | str = "cpu"):
        self.prompt_width = prompt_width
        self.budgets = torch.tensor(budgets, device=device)  # on input_ids' device: generate ORs the criteria

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.prompt_width) >= self.budgets


def hf_generate_turn(model, histories: list[list[int]], budgets: list[int], pad_id: int, args) -> list[list[int]]:
    width = max(map(len, histories))
    device = model.device
    input_ids = torch.tensor([[pad_id] * (width - len(h)) + h for h in histories], device=device)
    attention_mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories], device=device)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=True,
        max_new_tokens=max(budgets),
        min_new_tokens=min(budgets),
        stopping_criteria=StoppingCriteriaList([RowBudgets(width, budgets, device)]),
        temperature=1.0,
        top_k=args.top_k,
        top_p=args.top_p,
        pad_token_id=pad_id,
    )
    assert out.shape[1] - width == max(budgets)
    return [out[row, width : width + budget].tolist() for row, budget in enumerate(budgets)]


def time_hf_generate(model, work: Workload, pad_id: int, args) -> float:
    histories = [list(p) for p in work.prompts]
    start = time.perf_counter()
    with torch.inference_mode():
        for turn in range(len(work.budgets[0])):
            outputs = hf_generate_turn(model, histories, [b[turn] for b in work.budgets], pad_id, args)
            for row, output in enumerate(outputs):
                histories[row] += output + work.observations[row][turn]
            if work.env_s:
                time.sleep(work.env_s)  # every episode's env step, in parallel
    return time.perf_counter() - start


def time_engine(engine, loop, work: Workload, args) -> float:
    async def episode(row: int) -> int:
        history, produced = list(work.prompts[row]), 0
        for turn, budget in enumerate(work.budgets[row]):
            sampling = SamplingParams(max_new_tokens=budget, temperature=1.0, top_k=args.top_k, top_p=args.top_p)
            out = await engine.generate(history, sampling)
            assert len(out.output_ids) == budget
            produced += budget
            history += out.output_ids.tolist() + work.observations[row][turn]
            if work.env_s:
                await asyncio.sleep(work.env_s)
        return produced

    async def run_all():
        return await asyncio.gather(*(episode(row) for row in range(len(work.prompts))))

    start = time.perf_counter()
    produced = loop.run_until_complete(run_all())
    elapsed = time.perf_counter() - start
    assert sum(produced) == work.tokens
    return elapsed


def tiny_model(shape: str, vocab: int = 0, device: str = "cpu", dtype: torch.dtype | str = torch.float32):
    """The tiny random Qwen2 of `shape` (hidden x layers x heads) and its tokenizer, loaded back with
    `from_pretrained` in `dtype` onto `device`; no eos, so nothing stops early. A `vocab` larger
    than the tokenizer's resizes the embedding and LM head to it."""
    hidden, layers, heads = map(int, shape.split("x"))
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model", TEXTS, TinyShape(hidden_size=hidden, num_layers=layers, num_heads=heads)
        )
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if vocab > model.config.vocab_size:
        model.resize_token_embeddings(vocab, mean_resizing=False)
    model.to(device)
    model.generation_config.eos_token_id = None  # the engines get no stop ids either
    return model, tokenizer


def bench_shape(shape: str, args) -> None:
    hidden, layers, heads = map(int, shape.split("x"))
    model, tokenizer = tiny_model(shape, args.vocab, device=args.device, dtype=args.dtype)
    pad_id = tokenizer.pad_token_id
    biggest = max(1024, *map(int, args.batch_sizes.split(",")))
    engines = {
        "batch": TorchEngine(model, pad_token_id=pad_id, max_batch_size=biggest),
        "continuous": ContinuousTorchEngine(model, pad_token_id=pad_id, max_batch_size=biggest),
    }
    loop = asyncio.new_event_loop()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"\nmodel: Qwen2 hidden={hidden} layers={layers} heads={heads} vocab={model.config.vocab_size} "
        f"params={params / 1e6:.2f}M; {args.device} {args.dtype}; threads={torch.get_num_threads()}; "
        f"N={args.new_tokens} turns={args.turns} "
        f"env_ms={args.env_ms} top_k={args.top_k} top_p={args.top_p}; median of {args.repeats} repeats"
    )
    header = f"{'workload':>9} | {'batch':>5} | " + " | ".join(f"{name + ' tok/s':>16}" for name in CONTENDERS)
    print(header + f" | {'cont/generate':>13} | {'cont/batch':>10} | {'cont/batch per repeat':>21}")
    print("-" * len(header) + "-+-" + "-" * 13 + "-+-" + "-" * 10 + "-+-" + "-" * 21)

    def run(name: str, work: Workload) -> float:
        if name == "generate":
            return time_hf_generate(model, work, pad_id, args)
        return time_engine(engines[name], loop, work, args)

    for kind in args.workload.split(","):
        for batch_size in map(int, args.batch_sizes.split(",")):
            work = Workload(kind, make_prompts(tokenizer, batch_size), tokenizer, args)
            for name in CONTENDERS:  # warm-up
                run(name, work)
            times = {name: [] for name in CONTENDERS}
            for repeat in range(args.repeats):
                # Rotate which goes first, so none always runs in another's wake.
                order = CONTENDERS[repeat % 3 :] + CONTENDERS[: repeat % 3]
                for name in order:
                    times[name].append(run(name, work))
            rates = {name: work.tokens / statistics.median(times[name]) for name in CONTENDERS}
            cells = " | ".join(f"{rates[name]:>16.0f}" for name in CONTENDERS)
            each = [batch / continuous for batch, continuous in zip(times["batch"], times["continuous"], strict=True)]
            print(
                f"{kind:>9} | {batch_size:>5} | {cells} | {rates['continuous'] / rates['generate']:>13.2f} | "
                f"{rates['continuous'] / rates['batch']:>10.2f} | {f'{min(each):.2f} to {max(each):.2f}':>21}",
                flush=True,
            )
    stats = engines["continuous"].stats
    print(
        f"continuous engine, whole run: {stats['prefill_tokens']} tokens prefilled, {stats['reused_tokens']} reused "
        f"from kept KV caches, {stats['evictions']} evictions, {stats['steps']} decode steps, "
        f"{stats['prefills']} prefills"
    )
    loop.close()
    for engine in engines.values():
        engine.shutdown()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    for shape in args.shapes.split(","):
        bench_shape(shape, args)


if __name__ == "__main__":
    main()
