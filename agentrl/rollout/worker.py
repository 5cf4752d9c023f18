"""The rollout worker: an engine, the chat format and an env client; `collect(step)` runs one step's episodes.

The role's loop around it (shipping batches, taking weights) is agentrl/roles/rollout.py."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agentrl.algorithms.base import Algorithm, Reduce
from agentrl.config import AgentConfig, ChatConfig, EnvConfig, ModelConfig, RewardConfig, RolloutConfig
from agentrl.data.episode_dump import episode_record
from agentrl.data.tasks import SeededTasks, TaskSource
from agentrl.engine import loop_has_work, make_engine
from agentrl.engine.base import SamplingParams
from agentrl.models.chat_format import ChatFormat
from agentrl.models.loading import load_tokenizer
from agentrl.rollout.agent_loop import (
    EpisodeLimits,
    EpisodeRules,
    LoopTimers,
    gather_episodes,
    gather_polling,
    run_episode,
)
from agentrl.rollout.dispatch import DispatchServer, default_groups_in_flight
from agentrl.rollout.failures import error_kind
from agentrl.rollout.reward_hook import RewardFunction
from agentrl.scoring import make_scorer
from agentrl.trajectory import Episode


def task_index(tasks_per_step: int, round_: int, first_task: int, position: int) -> int:
    """A task's index within its step (its group id, and with the step its seed): round 0 holds the step's
    `tasks_per_step` tasks, each extra round of dynamic sampling the next `tasks_per_step` indices, and a
    rollout rank draws only from its own share (`first_task + position`, position < its share), so no two
    tasks of a run share (step, index) whatever the ranks and rounds."""
    return tasks_per_step * round_ + first_task + position


def chat_format(model: ModelConfig, env: EnvConfig, chat: ChatConfig) -> ChatFormat:
    """The env loop's chat format: the model folder's tokenizer and template in the family chat.format names (or
    detected), with chat.template_kwargs and chat.rewritten."""
    from agentrl.chat.detect import model_type_of

    return ChatFormat(
        load_tokenizer(model.path),
        env.system_prompt,
        chat_format=chat.format,
        template_kwargs=chat.template_kwargs,
        rewritten=chat.rewritten,
        model_type=model_type_of(Path(model.path)) if Path(model.path).is_dir() else None,
    )


def engine_seed(seed: int, rollout_index: int) -> int:
    return int(np.random.SeedSequence([seed, 2**31, rollout_index]).generate_state(1)[0])


@dataclass(frozen=True)
class WorkerSections:
    """What a RolloutWorker reads of the config: the `rollout` (episodes, sampling, the engine), `model`, `env`
    (system prompt, reward function), `agent` and `chat` sections; the run's `seed` and `run_dir`; `colocate`
    (`layout.colocate`: the engine shares a trainer's GPU); and `reward` (a judge or reward model)."""

    rollout: RolloutConfig
    model: ModelConfig
    env: EnvConfig
    agent: AgentConfig
    chat: ChatConfig
    seed: int
    run_dir: str
    colocate: bool
    reward: RewardConfig = field(default_factory=RewardConfig)

    @classmethod
    def of(cls, config) -> WorkerSections:
        return cls(
            config.rollout,
            config.model,
            config.env,
            config.agent,
            config.chat,
            config.seed,
            config.run_dir,
            config.layout.colocate,
            config.reward,
        )


class RolloutWorker:
    """Owns an engine, the chat format and an env client; `collect(step)` runs one step's episodes.

    It takes the sections it reads (`WorkerSections`), not the whole config, and `algorithm`, which builds the
    algorithm given a reduce (on rollout ranks only its `keep_group` and `max_extra_rounds` are used). `scorer`: where
    the `reward` section's episodes are scored when not here (a RemoteScorer to a scorer rank).
    """

    def __init__(
        self,
        env_client,
        rollout_index: int,
        rollout_count: int,
        device: str,
        task_source: TaskSource | None,
        sections: WorkerSections,
        algorithm: Callable[[Reduce], Algorithm],
        scorer=None,
    ):
        rollout, model, env, agent, chat = sections.rollout, sections.model, sections.env, sections.agent, sections.chat
        seed, run_dir, colocate = sections.seed, sections.run_dir, sections.colocate
        self.rollout_config, self.agent_config = rollout, agent
        self.rollout_index = rollout_index
        self.task_source = task_source or SeededTasks(seed)  # a dataset's rows, or the env's seeds
        self.env = env_client
        self.engine = make_engine(
            rollout.engine,
            model,
            device,
            engine_seed(seed, rollout_index),
            colocate=colocate,
            keep_loop_free=loop_has_work(rollout, agent.enabled, rollout_count),
        )
        self.chat = chat_format(model, env, chat)
        self.train_reasoning = chat.train_reasoning
        self.sampling = SamplingParams(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            stop_token_ids=self.chat.stop_ids,
        )
        self.limits = EpisodeLimits(rollout.max_turns, rollout.max_new_tokens, rollout.max_episode_tokens)
        # env.reward_fn, or the reward section's judge or reward model (on this rank's device), or None
        self.reward_fn = RewardFunction(env.reward_fn, env.reward_mode) if env.reward_fn else None
        self.reward_fn = self.reward_fn or scorer or make_scorer(sections.reward, device)
        self.errors_seen: set[str] = set()
        self.tasks = rollout.tasks_per_step // rollout_count
        self.first_task = rollout_index * self.tasks
        self.loop = self.engine.event_loop or asyncio.new_event_loop()  # SGLang serves requests on its own loop
        self.gateway = None  # agent programs (agent:): the policy served over HTTP on this rank
        if agent.enabled:
            from agentrl.gateway.server import Gateway

            port = agent.port + rollout_index if agent.port else 0
            self.gateway = Gateway(
                self.engine, self.chat.tokenizer, rollout.max_episode_tokens, agent, port, chat.format, chat.rewritten
            )
            self.gateway.start(self.loop)
            self.gateway.announce(Path(run_dir), rollout_index)
        self.algorithm = algorithm(_no_trainer_reduce)
        self.generated: list[Episode] = []  # the last step's episodes, trained or dropped (for episode dumps)
        self.kept_groups: set[int] = set()
        # Running ahead: called between engine batches while episodes are in flight (rollout.partial_rollouts; with
        # whole-episode versions and dynamic dispatch, wrapped by `when_idle`); it takes newly published weights and
        # returns False once the trainer said stop.
        self.between_batches: Callable[[], bool] | None = None
        # Whether `between_batches` may wait for the engine's batch boundaries (the timer runs only while none runs):
        # where the trainer's weight send does not wait for this rank to receive.
        self.weights_at_batches = False
        self.groups_live = 0  # rollout.dispatch=dynamic: claimed groups whose episodes are still running
        # rollout.dispatch=dynamic: where this rank claims its tasks (agentrl/rollout/dispatch.py); set by `run`,
        # else (one rollout rank) a queue of its own.
        self.dispatch = None
        if rollout.dispatch == "dynamic":
            self.groups_in_flight = rollout.groups_in_flight or default_groups_in_flight(
                rollout.tasks_per_step, rollout_count
            )
            if rollout_count == 1:
                extra = self.algorithm.max_extra_rounds
                self.dispatch = DispatchServer(None, [], rollout.tasks_per_step, extra, self.task_source)

    def collect(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        """This rank's share of `step`'s groups (grouped by task), plus timing and dynamic-sampling stats.

        Each finished group goes through the algorithm's `keep_group`; while groups are missing from
        the share, up to `algorithm.max_extra_rounds` more rounds run fresh tasks (about as many as the
        step's keep rate says will fill the gap, never more than the share). A share still short after
        the last round is trained as it is (`rollout/groups_short`); groups kept beyond the share are
        left out (`rollout/surplus_groups`). `rollout/success_rate` and `rollout/reward_mean` are over the
        first round, before any group was dropped: the policy's own numbers, where `episode/` metrics
        describe the trained batch.
        """
        if self.dispatch is not None:
            return self._collect_dispatched(step)
        rc = self.rollout_config
        timers = LoopTimers()
        busy_before = self.engine.busy_seconds
        started = time.perf_counter()
        kept: list[list[Episode]] = []
        generated: list[Episode] = []
        first_round: list[Episode] = []
        dropped = rounds = 0
        count = self.tasks
        while True:
            tasks = [task_index(rc.tasks_per_step, rounds, self.first_task, j) for j in range(count)]
            groups = self._run_tasks(step, tasks, len(generated), timers)
            first_round = first_round or [e for group in groups for e in group]
            for group in groups:
                generated.extend(group)
                rewards = np.array([e.reward for e in group if e.finish != "error"], dtype=np.float32)
                if self.algorithm.keep_group(rewards):
                    kept.append(group)
                else:
                    dropped += 1
            missing = self.tasks - len(kept)
            if missing <= 0 or rounds >= self.algorithm.max_extra_rounds:
                break
            rounds += 1
            done = len(generated) // rc.group_size
            count = min(self.tasks, math.ceil(missing * done / len(kept)) if kept else self.tasks)
        counts = {
            "rollout/generated_groups": float(len(generated) // rc.group_size),
            "rollout/dropped_groups": float(dropped),
            "rollout/extra_rounds": float(rounds),
            "rollout/groups_short": float(max(0, self.tasks - len(kept))),
            "rollout/surplus_groups": float(max(0, len(kept) - self.tasks)),
        }
        wall = time.perf_counter() - started
        return self._finish_step(step, generated, kept[: self.tasks], first_round, wall, busy_before, counts)

    def _collect_dispatched(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        """`collect` with rollout.dispatch=dynamic: groups claimed one at a time from the step's queue."""
        timers = LoopTimers()
        busy_before = self.engine.busy_seconds
        started = time.perf_counter()
        runs = [self._run_claimed(step, timers)]
        serving = isinstance(self.dispatch, DispatchServer)
        if serving:
            self.dispatch.open(step)
            runs.append(self.dispatch.serve())
        groups = self._run(runs)[0]
        queue_stats = self.dispatch.queue.stats() if serving else {}  # every rank's verdicts are in
        wall = self.last_group_ended - started  # this rank's own work: rank 0 also waited for the others' verdicts
        kept = [group for group, keep in groups if keep]
        generated = [e for group, _ in groups for e in group]
        first_round = [e for e in generated if e.group < self.rollout_config.tasks_per_step]
        counts = {
            "rollout/generated_groups": float(len(groups)),
            "rollout/dropped_groups": float(len(groups) - len(kept)),
            "rollout/extra_rounds": 0.0,
            "rollout/groups_short": 0.0,
            "rollout/surplus_groups": 0.0,
            **queue_stats,  # rank 0: the step's extra rounds and shortfall, over all ranks
            "rollout/first_round_episodes": float(len(first_round)),
        }
        return self._finish_step(step, generated, kept, first_round, wall, busy_before, counts)

    def _finish_step(
        self,
        step: int,
        generated: list[Episode],
        kept: list[list[Episode]],
        first_round: list[Episode],
        wall: float,
        busy_before: float,
        counts: dict[str, float],
    ) -> tuple[list[Episode], dict[str, float]]:
        """The kept groups' episodes and the step's stats; the step's episodes are kept for dumps."""
        self.report_errors(step, generated)
        self.generated, self.kept_groups = generated, {group[0].group for group in kept}
        generate = self.engine.busy_seconds - busy_before
        stats = {
            "time/rollout": wall,
            "time/generate": generate,
            "time/env": max(0.0, wall - generate),
            **counts,
            "rollout/success_rate": float(np.mean([e.success for e in first_round])) if first_round else 0.0,
            "rollout/reward_mean": float(np.mean([e.reward for e in first_round])) if first_round else 0.0,
            **self.task_source.stats(),
        }
        return [sample for group in kept for e in group for sample in (e, *e.more_samples)], stats

    async def _run_claimed(self, step: int, timers: LoopTimers) -> list[tuple[list[Episode], bool]]:
        """Keep up to `groups_in_flight` groups running, claiming the next task as each one ends; every group
        with its keep verdict, in the order they ended."""
        running: set[asyncio.Task] = set()
        ended: list[tuple[list[Episode], bool]] = []
        kept = dropped = first_key = 0
        done = False
        try:
            while True:
                free = self.groups_in_flight - len(running)
                if not done and free > 0:
                    claims = await self.dispatch.claim(step, free, len(running), kept, dropped)
                    kept = dropped = 0
                    done = claims == []
                    for index, position in claims or []:
                        task = self.task_source.at(step, index, position)
                        running.add(asyncio.ensure_future(self._run_group(step, index, task, first_key, timers)))
                        first_key += self.rollout_config.group_size
                if not running:
                    break
                finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for future in finished:
                    group = future.result()
                    rewards = np.array([e.reward for e in group if e.finish != "error"], dtype=np.float32)
                    keep = bool(self.algorithm.keep_group(rewards))
                    kept, dropped = kept + keep, dropped + (not keep)
                    ended.append((group, keep))
        finally:  # cancelled by a stop: no group outlives the step
            for future in running:
                future.cancel()
        self.last_group_ended = time.perf_counter()
        await self.dispatch.finish(step, kept, dropped)
        return ended

    async def _run_group(self, step: int, index: int, task, first_key: int, timers: LoopTimers) -> list[Episode]:
        episodes = self._episodes(index, task)
        self.groups_live += 1
        try:
            await gather_episodes(self._episode_runs(step, episodes, first_key, timers))
        finally:
            self.groups_live -= 1
        self._name_failed_rows(episodes)
        return episodes

    def when_idle(self, poll: Callable[[], bool]) -> Callable[[], bool]:
        """`poll`, called only while no claimed group is running (a `between_batches` for whole-episode versions)."""
        return lambda: poll() if self.groups_live == 0 else True

    def _run_tasks(self, step: int, tasks: list[int], first_key: int, timers: LoopTimers) -> list[list[Episode]]:
        """`group_size` episodes of each task, run concurrently; env keys (step, first_key + i) stay unique."""
        size = self.rollout_config.group_size
        taken = zip(tasks, self.task_source.take(step, tasks), strict=True)
        episodes = [e for index, task in taken for e in self._episodes(index, task)]
        self._run(self._episode_runs(step, episodes, first_key, timers))
        self._name_failed_rows(episodes)
        return [episodes[i : i + size] for i in range(0, len(episodes), size)]

    def _episodes(self, index: int, task) -> list[Episode]:
        """The `group_size` episodes of one task, not yet run."""
        return [
            Episode(
                group=index,
                task_seed=task.seed,
                task_id=task.id,
                task_options=task.options,
                data_source=(task.options or {}).get("data_source"),
            )
            for _ in range(self.rollout_config.group_size)
        ]

    def _episode_runs(self, step: int, episodes: list[Episode], first_key: int, timers: LoopTimers):
        return [self.episode(e, self.sampling, (step, first_key + i), timers) for i, e in enumerate(episodes)]

    def episode(self, episode: Episode, sampling: SamplingParams, key, timers: LoopTimers):
        """The coroutine that runs `episode`: the agent loop against the env, or the agent program (agent:)."""
        if self.gateway is not None:
            from agentrl.gateway.episode import run_agent_episode

            agent = self.agent_config
            return run_agent_episode(self.gateway, agent, episode, sampling, self.reward_fn, timers, self.env)
        rules = EpisodeRules(sampling, self.limits, self.reward_fn, self.train_reasoning)
        return run_episode(self.engine, self.env, self.chat, rules, episode, key, timers)

    def _run(self, coroutines) -> list:
        """Run coroutines to the end on this rank's loop; running ahead, new weights are taken between batches."""
        if self.between_batches is None:
            return self.loop.run_until_complete(gather_episodes(coroutines))
        engine = self.engine if self.weights_at_batches else None
        return self.loop.run_until_complete(gather_polling(coroutines, self.between_batches, engine))

    def _name_failed_rows(self, episodes: list[Episode]) -> None:
        source = getattr(self.task_source, "source", None)
        for episode in episodes:
            if episode.error and source is not None:  # name the row the env choked on
                episode.error = f"{source} row {episode.task_id}: {episode.error}"

    def episode_records(self, step: int) -> list[dict]:
        """The last step's episodes as dump records (rollout.dump_episodes), dropped groups included."""
        return [episode_record(e, step, e.group in self.kept_groups, self.rollout_index) for e in self.generated]

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


def _no_trainer_reduce(array: np.ndarray) -> np.ndarray:
    raise RuntimeError(
        "an algorithm called AlgorithmContext.reduce on a rollout rank; reduce sums over trainer ranks and "
        "exists only in the trainer's hooks (advantages, loss), not in rollout-side hooks such as keep_group"
    )
