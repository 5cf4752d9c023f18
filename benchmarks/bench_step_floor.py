"""How fast a decode step can get: `model.generate`'s step, the continuous engine's lean step, and the step's
matrix products alone, side by side.

    python benchmarks/bench_step_floor.py --shapes 64x2x4,256x4x8 --rows 32 --columns 40 --threads 1

For each model shape (the tiny random Qwen2 of bench_engine.py) it times, interleaved, medians of the repeats:

- `generate`: one decode step of `model.generate` (sampling, top-k 50, as in bench_engine.py): the time
  of `--rows` rows generating 8 + S tokens minus that of 8 tokens, over S;
- `lean`: one decode step of `LeanDecoder` (what the continuous engine runs) over `--columns` kept columns;
- `products`: only the matrix products of that step (fused q/k/v, output, fused gate/up, down projections,
  the attention's two batched products, the LM head), back to back on tensors of the step's shapes.

No engine step can take less than `products` with this matrix library, so generate/products bounds what
any engine can gain over `model.generate` on fixed-length single-turn outputs at that shape.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from bench_engine import tiny_model
from transformers import DynamicCache

from agentrl.engine.hf import cache_keyword
from agentrl.engine.lean_decoder import LeanDecoder


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x2x4,256x4x8", help="model shapes, hidden x layers x heads")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--columns", type=int, default=40, help="kept columns of a decode step")
    parser.add_argument("--steps", type=int, default=32, help="S: decode steps timed per generate call")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    return parser.parse_args()


def generate_step(model, rows: int, steps: int) -> float:
    """Seconds of one decode step of model.generate: the 8 + steps token run minus the 8 token run, over steps."""
    ids = torch.randint(3, model.config.vocab_size, (rows, 12))

    def run(new: int) -> float:
        start = time.perf_counter()
        model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=new,
            min_new_tokens=new,
            top_k=50,
            pad_token_id=0,
        )
        return time.perf_counter() - start

    return (run(8 + steps) - run(8)) / steps


class LeanStep:
    """One lean decode step over `columns` kept columns, the cache trimmed back after it."""

    def __init__(self, model, decoder: LeanDecoder, rows: int, columns: int):
        self.decoder, self.columns = decoder, columns
        self.cache = DynamicCache(config=model.config)
        prompt = torch.randint(0, model.config.vocab_size, (rows, columns))
        model(input_ids=prompt, **{cache_keyword(model): self.cache})
        self.tokens = torch.randint(0, model.config.vocab_size, (rows,))
        self.mask = torch.ones(rows, columns + 1, dtype=torch.bool)
        self.positions = torch.full((rows,), columns)

    def __call__(self) -> None:
        self.decoder.decode(self.tokens, self.mask, self.positions, self.cache)
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[..., : self.columns, :], layer.values[..., : self.columns, :]


class Products:
    """The matrix products of one decode step, on tensors of its shapes."""

    def __init__(self, decoder: LeanDecoder, rows: int, columns: int):
        hidden = decoder.final_norm.weight.shape[0]
        group = decoder.query_heads // decoder.kv_heads
        self.decoder = decoder
        self.x = torch.randn(rows, hidden)
        self.attention_out = torch.randn(rows, decoder.query_heads * decoder.head_dim)
        self.inner = torch.randn(rows, decoder.weights[0].inner)
        self.query = torch.randn(rows, decoder.kv_heads, group, decoder.head_dim)
        self.keys = torch.randn(rows, decoder.kv_heads, columns + 1, decoder.head_dim)
        self.probs = torch.randn(rows, decoder.kv_heads, group, columns + 1)

    def __call__(self) -> None:
        for weights in self.decoder.weights:
            F.linear(self.x, weights.qkv, weights.qkv_bias)
            torch.matmul(self.query, self.keys.transpose(-1, -2))
            torch.matmul(self.probs, self.keys)
            F.linear(self.attention_out, *weights.output)
            F.linear(self.x, weights.gate_up, weights.gate_up_bias)
            F.linear(self.inner, *weights.down)
        F.linear(self.x, *self.decoder.head)


def timed(step, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - start) / calls


def bench_shape(shape: str, args) -> None:
    model, _ = tiny_model(shape)
    decoder = LeanDecoder.for_model(model)
    lean, products = LeanStep(model, decoder, args.rows, args.columns), Products(decoder, args.rows, args.columns)
    times = {"generate": [], "lean": [], "products": []}
    with torch.inference_mode():
        generate_step(model, args.rows, 4)  # warm-ups
        timed(lean, 10)
        timed(products, 10)
        for _ in range(args.repeats):
            times["generate"].append(generate_step(model, args.rows, args.steps))
            times["lean"].append(timed(lean, 50))
            times["products"].append(timed(products, 50))
    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"| {shape} ({params:.2f}M) | {ms['generate']:.3f} | {ms['lean']:.3f} | {ms['products']:.3f} "
        f"| {ms['generate'] / ms['lean']:.2f} | {ms['generate'] / ms['products']:.2f} |"
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"decode step, ms: {args.rows} rows, {args.columns} kept columns, threads={torch.get_num_threads()}, "
        f"median of {args.repeats} repeats"
    )
    print("| shape | generate | lean | products | generate/lean | generate/products (the most any engine gains) |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        bench_shape(shape, args)


if __name__ == "__main__":
    main()
