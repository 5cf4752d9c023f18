"""What keeping finished rows' KV for a next turn costs the continuous engine, generate alone, on the digit step.

    python benchmarks/bench_kv_store.py                          # 60 steps per case
    python benchmarks/bench_kv_store.py --repo /path/to/other/checkout   # the same cases on other code

A step is 64 requests sent at once, as the digit step of benchmarks/vs_trl.py sends them (8 prompts x 8, 13 tokens,
2 new tokens, sampled), straight to the engine, with a tiny model of the quickstart's shape. Cases, each with its own
engine built once, steps rotating over them so the machine's load falls on all alike:

- `keep`: continuous, every finished row's KV stored for a next turn (the store is emptied before each step);
- `last`: continuous, the requests marked as their episode's last turn (`SamplingParams.last_turn`), nothing stored;
- `kv0`: continuous with `kv_cache_mb: 0`;
- `batch`: the batch scheduler.

Per case: the median of the engine's generate time a step (`busy_seconds`) and the process CPU time a step (what the
step cost the machine, less moved by other load). One torch thread. Code without `last_turn` runs the others.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]), help="the agentrl checkout to time")
parser.add_argument("--steps", type=int, default=60, help="steps timed per case")
args = parser.parse_args()
sys.path.insert(0, args.repo)

from agentrl.engine.base import SamplingParams  # noqa: E402
from agentrl.engine.continuous import ContinuousTorchEngine  # noqa: E402
from agentrl.engine.torch_engine import TorchEngine  # noqa: E402
from agentrl.models.loading import load_causal_lm  # noqa: E402
from agentrl.models.tiny import TinyShape, build_tiny_model  # noqa: E402

PROMPTS, GROUP, PROMPT_TOKENS = 8, 8, 13
SAMPLING = SamplingParams(max_new_tokens=2, temperature=1.0)
TEXTS = [f"Which digit is {digit}? Answer with the digit." for digit in range(10)] * 4


def engines(path: str) -> dict:
    cases = {
        "keep": (ContinuousTorchEngine, {}, SAMPLING),
        "kv0": (ContinuousTorchEngine, {"kv_cache_bytes": 0}, SAMPLING),
        "batch": (TorchEngine, {}, SAMPLING),
    }
    if "last_turn" in {field.name for field in dataclasses.fields(SamplingParams)}:
        cases["last"] = (ContinuousTorchEngine, {}, dataclasses.replace(SAMPLING, last_turn=True))
    return {
        name: (engine_class(load_causal_lm(path), pad_token_id=0, seed=0, **kwargs), sampling)
        for name, (engine_class, kwargs, sampling) in cases.items()
    }


def step_prompts(step: int, vocab: int) -> list[list[int]]:
    return [
        [(7 * prompt + step + j) % (vocab - 3) + 3 for j in range(PROMPT_TOKENS)]
        for prompt in range(PROMPTS)
        for _ in range(GROUP)
    ]


async def play(engine, sampling: SamplingParams, prompts: list[list[int]]) -> None:
    await asyncio.gather(*(engine.generate(prompt, sampling) for prompt in prompts))


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "m", TEXTS, TinyShape(hidden_size=64, num_layers=2, num_heads=4))
        cases = engines(str(path))
        vocab = load_causal_lm(str(path)).config.vocab_size
    busy = {name: [] for name in cases}
    cpu = {name: [] for name in cases}
    try:
        for step in range(args.steps + 1):  # step 0 warms every engine up, not counted
            prompts = step_prompts(step, vocab)
            names = list(cases)
            for offset in range(len(names)):
                name = names[(step + offset) % len(names)]
                engine, sampling = cases[name]
                if isinstance(engine, ContinuousTorchEngine):
                    engine.drop_cached_prefixes()
                busy_before, cpu_before = engine.busy_seconds, time.process_time()
                asyncio.run(play(engine, sampling, prompts))
                if step:
                    busy[name].append(engine.busy_seconds - busy_before)
                    cpu[name].append(time.process_time() - cpu_before)
    finally:
        for engine, _ in cases.values():
            engine.shutdown()
    print(f"\n{args.repo}: {args.steps} steps per case, 1 torch thread, medians\n")
    print("| case | generate ms/step | process CPU ms/step |\n|---|---|---|")
    for name in cases:
        print(f"| {name} | {1000 * statistics.median(busy[name]):.2f} | {1000 * statistics.median(cpu[name]):.2f} |")


if __name__ == "__main__":
    main()
