"""A rollout rank's memory and generation time with two LoRA policies on one shared base vs a copy of the base each.

python benchmarks/bench_shared_base.py [--size 100m] [--reps 3]

Each mode runs in a fresh process: a relay config with policies proposer and solver, each `model.lora` r8; `shared`
names one model.path for both (one SharedBaseEngine), `separate` gives the solver a copy of the folder (a merging
engine each, as before). The rollout worker (agentrl/policies/worker.py) is built, each policy's engine takes one
adapter sync (A random, B random small: what a trained adapter looks like), then: the process's resident memory
(VmRSS), the engines' weight bytes (each storage once; a merging engine's float32 copy of its adapted base
weights included), and the wall time of one round of greedy requests, `requests` per policy at once, median of reps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = {  # TinyShape fields
    "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
    "100m": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "vocab_size": 128},
}
RANK = 8


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(mode: str, model: str, copy: str, reps: int, requests: int) -> dict:
    import torch

    from agentrl.config import from_dict
    from agentrl.engine.base import SamplingParams
    from agentrl.policies.worker import MultiPolicyWorker

    torch.set_num_threads(1)
    started_rss = rss_mb()
    solver_model = {"path": model if mode == "shared" else copy, "lora": {"rank": RANK, "alpha": 2 * RANK}}
    config = from_dict(
        {
            "model": {"path": model, "lora": {"rank": RANK, "alpha": 2 * RANK}},
            "env": {"id": "relay", "kwargs": {"numbers": 3}},
            "layout": {"trainer": 2, "rollout": 1},
            "policies": {"proposer": {}, "solver": {"model": solver_model}},
            "game": {"players": {"proposer": "proposer", "solver": "solver"}},
        }
    )
    worker = MultiPolicyWorker(config, None, 0, 1, "cpu")
    generator = torch.Generator().manual_seed(0)
    for engine in worker.engines.values():
        adapters = []
        for module, linear in engine.model.named_modules():
            if isinstance(linear, torch.nn.Linear) and module.rsplit(".", 1)[-1] in config.model.lora.target_modules:
                out_features, in_features = linear.weight.shape
                adapters.append((module + ".lora_A", torch.randn(RANK, in_features, generator=generator) * 0.01))
                adapters.append((module + ".lora_B", torch.randn(out_features, RANK, generator=generator) * 0.01))
        engine.load_weights(adapters, version=1)
    memory = worker.memory()
    after_rss = rss_mb()
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    vocab = min(e.model.get_input_embeddings().num_embeddings for e in worker.engines.values())
    prompts = [[(7 * i + j) % (vocab - 3) + 3 for j in range(24)] for i in range(requests)]

    async def one_round():
        return await asyncio.gather(*(e.generate(p, greedy) for e in worker.engines.values() for p in prompts))

    times = []
    for _ in range(reps):
        began = time.perf_counter()
        asyncio.run(one_round())
        times.append(time.perf_counter() - began)
    return {
        "mode": mode,
        "rss_mb": round(after_rss, 1),
        "rss_mb_of_engines": round(after_rss - started_rss, 1),
        "weights_mb": round(memory["weights"] / 2**20, 1),
        "adapters_mb": round(memory["adapters"] / 2**20, 2),
        "round_s": round(statistics.median(times), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="100m", choices=sorted(SIZES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8, help="greedy requests per policy in a round")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "MODEL", "COPY"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.reps, args.requests)), flush=True)
        return
    from agentrl.models.tiny import TinyShape, build_tiny_model

    with tempfile.TemporaryDirectory() as folder:
        model, copy = Path(folder) / "base", Path(folder) / "copy"
        texts = [f"pose {n} add one to {n} answer {n + 1}" for n in range(20)]
        build_tiny_model(model, texts, TinyShape(**SIZES[args.size]))
        shutil.copytree(model, copy)
        for mode in ("shared", "separate"):
            command = [sys.executable, __file__, "--reps", str(args.reps), "--requests", str(args.requests)]
            result = subprocess.run(
                [*command, "--child", mode, str(model), str(copy)], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                raise SystemExit(f"{mode} failed:\n{result.stderr[-3000:]}")
            print(f"size={args.size} " + result.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
