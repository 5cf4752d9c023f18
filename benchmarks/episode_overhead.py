"""What one episode's env costs outside the model, part by part (issue: the per-episode overhead).

    python benchmarks/episode_overhead.py                  # the qa env on the digit task, 64 episodes a batch
    python benchmarks/episode_overhead.py --env calculator --episodes 256

Each line is a median over repeats, in microseconds per episode:
- `entry-point scan`: what every episode paid before plug-ins were cached (importlib.metadata's scan of
  every installed package), against `resolve (cached)`, what it pays now;
- `construct`, `reset`, `step`, `close`: the env's own calls, in this process;
- `host, inline` and `host, threads`: one batch each of reset, step and close through the env host, as a
  rollout or env rank runs them (`threads`: with runtime.env_step_timeout_s, each call in a worker thread).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.env.host import EnvHost
from agentrl.env.registry import ENTRY_POINT_GROUP, resolve
from benchmarks.tasks.digit import rows

ENVS = {  # env id -> (kwargs, the reset options of an episode, its one action)
    "qa": ({"reward_fn": "benchmarks.tasks.digit:digit_reward", "max_steps": 1}, rows(1)[0], "3"),
    "calculator": ({}, None, "4"),
    "guess_number": ({"low": 1, "high": 7}, None, "3"),
}


def per_call_us(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def host_batch_us(env_id: str, kwargs: dict, options, action: str, episodes: int, timeout_s, repeats: int) -> float:
    host = EnvHost(env_id, kwargs, call_timeout_s=timeout_s)

    def batch() -> None:
        host.handle_batch([("reset", key, key, options) for key in range(episodes)])
        host.handle_batch([("step", key, action) for key in range(episodes)])
        host.handle_batch([("close", key) for key in range(episodes)])

    return per_call_us(batch, repeats) / episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="qa", choices=sorted(ENVS))
    parser.add_argument("--episodes", type=int, default=64, help="episodes in one host batch")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    kwargs, options, action = ENVS[args.env]
    constructor = resolve(args.env)
    env = constructor(**kwargs)

    def reset() -> None:
        env.reset(seed=0, options=options)

    def reset_step() -> None:
        env.reset(seed=0, options=options)
        env.step(action)

    reset_us = per_call_us(reset, args.repeats)
    lines = [
        ("entry-point scan (per episode before; qa)", per_call_us(lambda: entry_points(group=ENTRY_POINT_GROUP), 20)),
        ("resolve (cached)", per_call_us(lambda: resolve(args.env), args.repeats)),
        ("construct", per_call_us(lambda: constructor(**kwargs), args.repeats)),
        ("reset", reset_us),
        ("step", per_call_us(reset_step, args.repeats) - reset_us),
        ("close", per_call_us(env.close, args.repeats)),
        ("host, inline: reset+step+close", host_batch_us(args.env, kwargs, options, action, args.episodes, None, 20)),
        ("host, threads: reset+step+close", host_batch_us(args.env, kwargs, options, action, args.episodes, 60, 20)),
    ]
    print(f"{args.env}: microseconds per episode (median), host batches of {args.episodes}")
    print(f"| {'part':<42} | {'us':>9} |")
    print(f"|{'-' * 44}|{'-' * 11}|")
    for name, value in lines:
        print(f"| {name:<42} | {value:9.1f} |")


if __name__ == "__main__":
    main()
