"""What a rollout step costs outside generation: `RolloutWorker.collect` and `pack` with an engine that answers at once.

    python benchmarks/rollout_loop_cost.py CONFIG [--steps 60] [key=value ...]
    PYTHONPATH=OTHER_CHECKOUT python benchmarks/rollout_loop_cost.py CONFIG     # another checkout's agentrl

The config's rollout worker (its env host in this process, its chat format, its tasks) runs `--steps` steps, but
each turn's reply is a digit and the end-of-turn token, returned without running the model: what is left is
agentrl's own work a step (env calls, the agent loop and asyncio, chat ids, episode bookkeeping, packing). It
prints the median wall and CPU milliseconds a step (the first fifth left out) and packing's share. A diagnostic,
not a training run: `benchmarks/step_phases.py` times the real step.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: another checkout's agentrl may run

from agentrl.config.load import load_config
from agentrl.engine.base import GenerateOutput
from agentrl.env.client import LocalEnvClient
from agentrl.roles.env import env_host
from agentrl.roles.rollout_parts import rollout_worker, task_source
from agentrl.trajectory import pack


class AnsweringEngine:
    """The worker's engine, but `generate` answers with the next of `replies` at once (the model never runs)."""

    def __init__(self, engine, replies: list[list[int]]):
        self.engine, self.replies, self.calls = engine, replies, 0

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    async def generate(self, input_ids, sampling) -> GenerateOutput:
        self.calls += 1
        ids = self.replies[self.calls % len(self.replies)][: sampling.max_new_tokens]
        logprobs = np.full(len(ids), -0.5, dtype=np.float32)
        return GenerateOutput(np.array(ids), logprobs, "stop", weight_version=self.engine.weight_version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("overrides", nargs="*", help="key=value, as for agentrl train")
    args = parser.parse_intermixed_args()
    config = load_config(args.config, args.overrides)
    client = LocalEnvClient(env_host(config, check=False))
    tasks = task_source(config, 0, 1, [0])
    worker = rollout_worker(config, client, 0, 1, "cpu", tasks)
    tokenizer, eos = worker.chat.tokenizer, worker.chat.eos_id
    replies = [[*tokenizer(str(digit), add_special_tokens=False)["input_ids"], eos] for digit in range(10)]
    worker.engine = AnsweringEngine(worker.engine, replies)
    gc.collect()
    gc.freeze()  # as the roles do before their first step (agentrl/run/startup_gc.py)
    walls, cpus, packing = [], [], []
    for step in range(args.steps):
        wall, cpu = time.perf_counter(), time.process_time()
        episodes, _ = worker.collect(step)
        packed = time.perf_counter()
        batch = pack(episodes)
        packing.append(time.perf_counter() - packed)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    client.shutdown()
    kept = slice(args.steps // 5, None)
    print(
        f"{Path(args.config).name}: {len(episodes)} episodes a step, {batch['turns'].mean():.2f} turns each; "
        f"ms a step (median): wall {statistics.median(walls[kept]) * 1e3:.2f}, "
        f"CPU {statistics.median(cpus[kept]) * 1e3:.2f}, of which pack {statistics.median(packing[kept]) * 1e3:.2f}"
    )


if __name__ == "__main__":
    main()
