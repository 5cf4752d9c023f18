"""The rollout role: generate a step's episodes, ship them to the trainers, take new weights."""

from __future__ import annotations

import asyncio
import sys
import time

import numpy as np

from agentrl import preempt, transport
from agentrl.failures import FailureTally, error_kind
from agentrl.rollout.agent_loop import EpisodeLimits, LoopTimers, run_episode
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.engine import SamplingParams
from agentrl.rollout.reward_fn import RewardFunction
from agentrl.trainer.model import load_causal_lm, load_tokenizer
from agentrl.trajectory import Episode, pack
from agentrl.transport import Tag


def make_engine(config, device: str, seed: int):
    engine = config.rollout.engine
    if engine.backend == "sglang":
        from agentrl.rollout.sglang_engine import SGLangEngine

        return SGLangEngine.from_config(config, device, seed)
    from agentrl.rollout.torch_engine import TorchEngine

    model = load_causal_lm(config.model.path, config.model.dtype, device)
    tokenizer = load_tokenizer(config.model.path)
    return TorchEngine(model, pad_token_id=tokenizer.pad_token_id, max_batch_size=engine.max_batch_size, seed=seed)


def task_seed(seed: int, step: int, task: int) -> int:
    return int(np.random.SeedSequence([seed, step, task]).generate_state(1)[0])


def engine_seed(seed: int, rollout_index: int) -> int:
    return int(np.random.SeedSequence([seed, 2**31, rollout_index]).generate_state(1)[0])


class RolloutWorker:
    """Owns an engine, the chat format and an env client; `collect(step)` runs one step's episodes."""

    def __init__(self, config, env_client, rollout_index: int, rollout_count: int, device: str = "cpu"):
        self.config = config
        rc = config.rollout
        self.env = env_client
        self.engine = make_engine(config, device, seed=engine_seed(config.seed, rollout_index))
        self.chat = ChatFormat(load_tokenizer(config.model.path), config.env.system_prompt)
        self.sampling = SamplingParams(
            max_new_tokens=rc.max_new_tokens,
            temperature=rc.temperature,
            top_p=rc.top_p,
            top_k=rc.top_k,
            stop_token_ids=self.chat.stop_ids,
        )
        self.limits = EpisodeLimits(rc.max_turns, rc.max_new_tokens, rc.max_episode_tokens)
        env_config = config.env
        self.reward_fn = RewardFunction(env_config.reward_fn, env_config.reward_mode) if env_config.reward_fn else None
        self.errors_seen: set[str] = set()
        self.tasks = rc.tasks_per_step // rollout_count
        self.first_task = rollout_index * self.tasks
        self.loop = self.engine.event_loop or asyncio.new_event_loop()  # SGLang serves requests on its own loop

    def collect(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        """All episodes of this rank's tasks for `step`, grouped by task; plus timing stats."""
        episodes = [
            Episode(group=task, task_seed=task_seed(self.config.seed, step, task))
            for task in range(self.first_task, self.first_task + self.tasks)
            for _ in range(self.config.rollout.group_size)
        ]
        timers = LoopTimers()
        busy_before = self.engine.busy_seconds
        started = time.perf_counter()
        runs = [
            run_episode(
                self.engine, self.env, self.chat, self.sampling, self.limits, e, (step, i), timers, self.reward_fn
            )
            for i, e in enumerate(episodes)
        ]
        self.loop.run_until_complete(_gather(runs))
        self.report_errors(step, episodes)
        wall = time.perf_counter() - started
        generate = self.engine.busy_seconds - busy_before
        return episodes, {"time/rollout": wall, "time/generate": generate, "time/env": max(0.0, wall - generate)}

    def report_errors(self, step: int, episodes: list[Episode]) -> None:
        """Print each new kind of episode error once (in full), so failures are seen, not just counted."""
        failed = [e for e in episodes if e.error]
        new = {}
        for episode in failed:
            headline = error_kind(episode.error)
            if headline not in self.errors_seen:
                new.setdefault(headline, episode.error)
        for headline, error in new.items():
            self.errors_seen.add(headline)
            count = sum(error_kind(e.error) == headline for e in failed)
            print(
                f"agentrl: step {step}: {count} episode(s) failed (counted in episode/failed; "
                f"later repeats of this error are only counted):\n{error}",
                file=sys.stderr,
                flush=True,
            )


async def _gather(coroutines):
    return await asyncio.gather(*coroutines)


def shard_for_trainers(episodes: list[Episode], trainers: int) -> list[list[Episode]]:
    """Split whole groups evenly over trainer ranks (groups are contiguous)."""
    groups = sorted({e.group for e in episodes})
    owner = {group: index for index, chunk in enumerate(np.array_split(groups, trainers)) for group in chunk.tolist()}
    shards: list[list[Episode]] = [[] for _ in range(trainers)]
    for episode in episodes:
        shards[owner[episode.group]].append(episode)
    return shards


def run(config, layout, start_step: int, env_client, weight_sync) -> None:
    """The rollout rank's loop; ends early when the trainer leader sends stop instead of weights."""
    index = layout.rollout_ranks.index(layout.rank)
    worker = RolloutWorker(config, env_client, index, len(layout.rollout_ranks), layout.device)
    weight_sync.receive(worker.engine)
    for step in range(start_step, config.steps):
        episodes, stats = worker.collect(step)
        failures = FailureTally.of(episodes)  # of the whole step on this rank: the trainer leader judges the step
        preempt.forward(layout.world, layout.trainer_ranks[0])  # before the batch, so it is seen at this step's end
        for trainer_index, (trainer_rank, shard) in enumerate(
            zip(layout.trainer_ranks, shard_for_trainers(episodes, len(layout.trainer_ranks)), strict=True)
        ):
            samples = sample_texts(config, step, shard) if trainer_index == 0 and index == 0 else []
            message = {"batch": pack(shard), "stats": stats, "samples": samples, "failures": failures}
            transport.send(layout.world, message, trainer_rank, Tag.TRAJECTORIES)
        if step + 1 < config.steps and weight_sync.receive(worker.engine) is None:
            break
    env_client.shutdown()


def sample_texts(config, step: int, episodes: list[Episode]) -> list[str]:
    """A few whole episodes as text for TensorBoard, every `logging.sample_every` steps."""
    every = config.logging.sample_every
    if not every or step % every:
        return []
    return [
        f"reward={e.reward:.2f} turns={e.turns} finish={e.finish} version={e.weight_version}\n{e.text}"
        for e in episodes[: config.logging.num_samples]
    ]
