"""Generate time of a GRPO step with and without shared prompt prefills (engine/shared_prompts.py), both schedulers.

    python benchmarks/bench_shared_prompts.py                    # both tasks, 15 steps per case
    python benchmarks/bench_shared_prompts.py --tasks digit --repeats 31
    python benchmarks/bench_shared_prompts.py --kv-cache-mb 0       # the continuous engine keeping no KV

A step is what a rollout rank generates for one training step, played through the real agent loop
(agentrl/rollout/agent_loop.py) against the real env in this process, with the quickstart's tiny model
(64 x 2 x 4, vocabulary 128, its tokenizer trained on the task's texts as `agentrl train` builds it):

- `digit` (benchmarks/vs_trl.py, issue 53): 8 prompts x 8 completions, one turn of 2 new tokens;
- `guess` (launch/configs/quickstart.yaml): 32 games x 8, up to 4 turns of 1 token; every game opens with the same
  prompt, and games whose guesses agree send the same conversation again.

Per step: `generate` is the engine's own time (its `busy_seconds`, the rollout's time/generate metric), `wall` the
step's, `prefill` and `shared` the prompt tokens run through the model and those a row took from another row's
prefill, `reused` those a later turn took from the KV the continuous engine kept of the episode's turn before
(`--kv-cache-mb` of memory for it, as `rollout.engine.kv_cache_mb`; an episode's last turn is not kept). Each
(scheduler, sharing) case has its own engine, built once; steps rotate over the cases so the machine's load falls on
all alike, and the continuous engine's kept KV is dropped before each step, as a new weight version drops it in
training. One torch thread (`--threads`). The table gives medians and the ratio off/on of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentrl.config import from_dict  # noqa: E402
from agentrl.engine.base import SamplingParams  # noqa: E402
from agentrl.engine.continuous import ContinuousTorchEngine  # noqa: E402
from agentrl.engine.torch_engine import TorchEngine  # noqa: E402
from agentrl.env.client import LocalEnvClient  # noqa: E402
from agentrl.env.host import EnvHost  # noqa: E402
from agentrl.models.loading import ensure_model, load_causal_lm, load_tokenizer  # noqa: E402
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode  # noqa: E402
from agentrl.rollout.worker import chat_format  # noqa: E402
from agentrl.run.tokenizer_corpus import env_texts  # noqa: E402
from agentrl.trajectory import Episode  # noqa: E402
from benchmarks.tasks import digit  # noqa: E402

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128, "init_std": 0.1}  # the quickstart's
GAME = {"low": 1, "high": 7, "max_guesses": 4, "progress_reward": 0.5, "name_the_last": True}  # the quickstart's
TASKS = {  # task -> (prompts a step, rollout settings)
    "digit": (8, {"max_turns": 1, "max_new_tokens": 2, "max_episode_tokens": 64}),
    "guess": (32, {"max_turns": 4, "max_new_tokens": 1, "max_episode_tokens": 256}),
}
GROUP = 8
CASES = [(scheduler, share) for scheduler in ("batch", "continuous") for share in (False, True)]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--repeats", type=int, default=15, help="steps timed per case")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--kv-cache-mb", type=float, default=256, help="the continuous engine's KV store budget")
    return parser.parse_args()


def task_config(task: str, out: Path):
    prompts, rollout = TASKS[task]
    config = {
        "run_dir": str(out / "runs" / task),
        "model": {"path": str(out / f"model-{task}"), "tiny": TINY},
        "rollout": {"tasks_per_step": prompts, "group_size": GROUP, **rollout},
    }
    if task == "digit":
        digit.write(out / "digit.jsonl", 512)
        config["data"] = {"train": str(out / "digit.jsonl")}
        config["env"] = {"id": "qa", "kwargs": {"reward_fn": "benchmarks.tasks.digit:digit_score", "max_steps": 1}}
    else:
        config["env"] = {"id": "guess_number", "kwargs": GAME}
    return from_dict(config)


def make_engine(path: str, scheduler: str, share: bool, kv_cache_mb: float):
    model = load_causal_lm(path)
    pad = load_tokenizer(path).pad_token_id
    if scheduler == "batch":
        return TorchEngine(model, pad_token_id=pad, seed=0, share_prompts=share)
    kv_cache_bytes = int(kv_cache_mb * (1 << 20))
    return ContinuousTorchEngine(model, pad_token_id=pad, seed=0, share_prompts=share, kv_cache_bytes=kv_cache_bytes)


def step_tasks(task: str, step: int) -> list[tuple[int, dict | None]]:
    """Each prompt's (seed, dataset row) for training step `step`."""
    prompts = TASKS[task][0]
    if task == "digit":
        rows = digit.rows(512)
        return [(step * prompts + i, rows[(step * prompts + i) % len(rows)]) for i in range(prompts)]
    return [(step * prompts + i, None) for i in range(prompts)]


def play_step(engine, client, chat, rules, tasks, step: int) -> tuple[float, list[int]]:
    """One step's episodes, group by group, all at once; the wall seconds and each group's prompt length."""
    episodes = [
        Episode(group=g, task_seed=seed, task_options=row) for g, (seed, row) in enumerate(tasks) for _ in range(GROUP)
    ]

    async def run():
        await asyncio.gather(*(run_episode(engine, client, chat, rules, e, (step, i)) for i, e in enumerate(episodes)))

    started = time.perf_counter()
    asyncio.run(run())
    wall = time.perf_counter() - started
    failed = [e.error for e in episodes if e.error]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed, e.g. {failed[0]}")
    return wall, [e.prompt_len for e in episodes[::GROUP]]


def bench_task(task: str, out: Path, args) -> list[dict]:
    config = task_config(task, out)
    ensure_model(config.model, lambda: env_texts(config))
    chat = chat_format(config.model, config.env, config.chat)
    limits = EpisodeLimits(config.rollout.max_turns, config.rollout.max_new_tokens, config.rollout.max_episode_tokens)
    rules = EpisodeRules(SamplingParams(max_new_tokens=config.rollout.max_new_tokens, temperature=1.0), limits)
    client = LocalEnvClient(EnvHost(config.env.id, dict(config.env.kwargs), call_timeout_s=None))
    engines = {case: make_engine(config.model.path, *case, args.kv_cache_mb) for case in CASES}
    samples = {case: {"generate": [], "wall": [], "prefill": [], "shared": [], "reused": []} for case in CASES}
    try:
        for step in range(args.repeats + 1):  # step 0 warms every engine up, not counted
            tasks = step_tasks(task, step)
            for offset in range(len(CASES)):
                case = CASES[(step + offset) % len(CASES)]
                engine = engines[case]
                if isinstance(engine, ContinuousTorchEngine):
                    engine.drop_cached_prefixes()
                busy, prefill, shared, reused = (
                    engine.busy_seconds,
                    engine.stats["prefill_tokens"],
                    engine.stats["shared_tokens"],
                    engine.stats.get("reused_tokens", 0),
                )
                wall, prompt_lengths = play_step(engine, client, chat, rules, tasks, step)
                if step:
                    got = samples[case]
                    got["generate"].append(engine.busy_seconds - busy)
                    got["wall"].append(wall)
                    got["prefill"].append(engine.stats["prefill_tokens"] - prefill)
                    got["shared"].append(engine.stats["shared_tokens"] - shared)
                    got["reused"].append(engine.stats.get("reused_tokens", 0) - reused)
    finally:
        for engine in engines.values():
            engine.shutdown()
        client.shutdown()
    print(f"{task}: prompts of {min(prompt_lengths)}-{max(prompt_lengths)} tokens", flush=True)
    return [{"task": task, "scheduler": case[0], "share": case[1], **samples[case]} for case in CASES]


def table(results: list[dict]) -> str:
    lines = [
        "| task | scheduler | generate ms/step off | on | off/on | wall ms/step off | on | off/on | "
        "prefill tokens/step off | on | shared on | reused off | on |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_case = {(r["task"], r["scheduler"], r["share"]): r for r in results}
    for task, scheduler in dict.fromkeys((r["task"], r["scheduler"]) for r in results):
        off, on = by_case[task, scheduler, False], by_case[task, scheduler, True]
        gen_off, gen_on = (1000 * statistics.median(r["generate"]) for r in (off, on))
        wall_off, wall_on = (1000 * statistics.median(r["wall"]) for r in (off, on))
        prefill_off, prefill_on = (statistics.median(r["prefill"]) for r in (off, on))
        lines.append(
            f"| {task} | {scheduler} | {gen_off:.1f} | {gen_on:.1f} | {gen_off / gen_on:.2f}x | {wall_off:.1f} | "
            f"{wall_on:.1f} | {wall_off / wall_on:.2f}x | {prefill_off:.0f} | {prefill_on:.0f} | "
            f"{statistics.median(on['shared']):.0f} | {statistics.median(off['reused']):.0f} | "
            f"{statistics.median(on['reused']):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            results += bench_task(task, Path(tmp), args)
    print(f"\ntorch threads {args.threads}, {args.repeats} steps per case, kv_cache_mb {args.kv_cache_mb:g}, medians\n")
    print(table(results))


if __name__ == "__main__":
    main()
