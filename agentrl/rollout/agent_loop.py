"""The multi-turn agent loop: one coroutine per episode.

    prompt -> generate a turn -> env.step(action text) -> observation tokens -> generate ...

Generated tokens enter the episode exactly as the engine returned them (loss mask 1,
with their logprobs; a turn's reasoning block at 0 with chat.train_reasoning=false); template and
observation tokens enter with loss mask 0. The chat format (agentrl/models/chat_format.py) is the
run's family: it parses each turn, closes a turn the length cut, and turns tool results into tool
messages whose template ids follow the turn (docs/chat-formats.md, Wiring).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace

from agentrl.chat.errors import ChatTemplateError, NotAppendOnly
from agentrl.engine.base import Engine, SamplingParams
from agentrl.models.chat_format import ChatFormat
from agentrl.models.content_tokens import ContentError
from agentrl.rollout.reward_hook import RewardFunction
from agentrl.scoring import ModelScorer, ScoreFailed
from agentrl.trajectory import Episode, RewardError, finite_reward, state_key

# Numbers an env's `info` may carry that are summed into `Episode.metrics` (besides `info["metrics"]`).
INFO_COUNTS = ("tool_calls", "tool_errors")


@dataclass
class EpisodeLimits:
    max_turns: int
    max_new_tokens: int
    max_episode_tokens: int


@dataclass(frozen=True)
class EpisodeRules:
    """How an episode is played and scored: each turn's sampling, the limits that end it, and the reward function,
    judge or reward model named in the config (None: the env's rewards alone)."""

    sampling: SamplingParams
    limits: EpisodeLimits
    reward_fn: RewardFunction | ModelScorer | None = None
    train_reasoning: bool = True  # chat.train_reasoning: False puts a turn's reasoning tokens at loss mask 0


@dataclass
class LoopTimers:
    """Seconds spent awaiting the engine and the envs, summed over episodes."""

    generate: float = 0.0
    env: float = 0.0


async def run_episode(
    engine: Engine, env, chat: ChatFormat, rules: EpisodeRules, episode: Episode, key, timers: LoopTimers | None = None
) -> Episode:
    """`episode` played by `engine` against `env` (its env key `key`), formatted by `chat`, as `rules` say."""
    sampling, limits, reward_fn = rules.sampling, rules.limits, rules.reward_fn
    timers = timers or LoopTimers()
    started = time.perf_counter()
    result = await env.call("reset", key, episode.task_seed, episode.task_options)
    timers.env += time.perf_counter() - started
    if not result.ok:
        return _failed(episode, result.error)
    observation, reset_info, tools = result.value
    task, transcript, info = observation, [], reset_info if isinstance(reset_info, dict) else {}
    context = info.get("prompt_messages", ())  # messages a dataset row puts before its question (the qa env)
    episode.text = observation
    episode.messages, episode.tools = chat.prompt_messages(observation, context), tools
    try:
        prompt_ids = chat.prompt_ids(observation, tools, context)
    except (ContentError, ChatTemplateError) as error:  # content the template would not write verbatim; a refusal
        return _failed(episode, str(error))
    episode.extend(prompt_ids, mask=0)
    episode.prompt_len = len(episode.tokens)
    versions = set()

    for index in range(limits.max_turns):
        budget = limits.max_episode_tokens - len(episode.tokens) - 1  # room to close the turn
        if budget <= 0:
            episode.finish = "max_tokens"
            break
        opened = chat.opens_reasoning(episode.tokens)
        started = time.perf_counter()
        last = index == limits.max_turns - 1
        turn_sampling = _for_turn(sampling, min(limits.max_new_tokens, budget), episode.turns, last)
        output = await engine.generate(episode.tokens, turn_sampling)
        timers.generate += time.perf_counter() - started
        versions.add(output.weight_version)
        episode.turn_states.append(state_key(info.get("state_key", observation)))
        action = chat.action_text(output.output_ids, opened)
        turn = chat.parse(action, tools)
        message = chat.assistant_message(turn, output.output_ids)
        episode.messages.append(message)
        turn_start = len(episode.tokens)
        episode.extend(output.output_ids, mask=1, logprobs=output.logprobs, version=output.weight_version)
        episode.turn_spans.append((turn_start, len(episode.tokens)))
        if turn.reasoning:
            reasoning = chat.reasoning_length(output.output_ids, opened, tools)
            episode.add_metrics({"reasoning_tokens": reasoning})
            if not rules.train_reasoning:
                episode.loss_mask[turn_start : turn_start + reasoning] = [0] * reasoning
        stopped = output.finish_reason == "stop"
        if not stopped:  # close the turn the model did not close
            try:
                episode.extend(chat.closing_ids(episode.messages, tools), mask=0)
            except ChatTemplateError as error:
                env.close(key)
                return _failed(episode, str(error))
        episode.turns += 1

        started = time.perf_counter()
        result = await env.call("step", key, action)
        timers.env += time.perf_counter() - started
        if not result.ok:
            return _failed(episode, result.error)
        observation, reward, terminated, truncated, info = result.value
        try:
            reward = finite_reward(reward, "the env's step reward")
            episode.reward = finite_reward(episode.reward + reward, "the env's rewards summed over the episode")
        except RewardError as refused:
            env.close(key)
            return _failed(episode, f"{refused}; fix the env's step() (the episode failed and does not train)")
        episode.turn_rewards.append(reward)
        episode.success = episode.success or bool(info.get("success", False))
        episode.add_metrics({name: info[name] for name in INFO_COUNTS if name in info})
        episode.add_metrics(info.get("metrics", {}))
        episode.text += f"\n>>> {action}\n{observation}"
        transcript.append((action, observation))
        if terminated or truncated:
            episode.finish = "terminated" if terminated else "truncated"
            break
        new = chat.observation_messages(observation, info, message)
        ended_with = int(output.output_ids[-1]) if stopped and len(output.output_ids) else None
        try:
            observation_ids = chat.continuation_ids(episode.messages, new, tools, ended_with)
        except NotAppendOnly:  # chat.rewritten=new_sample: the conversation so far, rendered, starts a new sample
            observation_ids = None
        except (ContentError, ChatTemplateError) as error:
            env.close(key)
            return _failed(episode, str(error))
        episode.messages += new
        if observation_ids is None:
            prompt = chat.new_sample_ids(episode.messages, tools)
            if len(prompt) >= limits.max_episode_tokens:
                episode.finish = "max_tokens"
                break
            _start_new_sample(episode, prompt)
            continue
        if len(episode.tokens) + len(observation_ids) >= limits.max_episode_tokens:
            episode.finish = "max_tokens"
            break
        episode.extend(observation_ids, mask=0)
    else:
        episode.finish = "max_turns"

    env.close(key)
    episode.weight_version = min(versions) if versions else -1
    if reward_fn is not None:
        try:
            score = await reward_fn.score(
                completion=transcript[-1][0] if transcript else "",
                task=task,
                answer=reset_info.get("answer") if isinstance(reset_info, dict) else None,
                transcript=transcript,
                env_reward=episode.reward,
                info=info,
                reset_info=reset_info,
                finish=episode.finish,
            )
            reward = reward_fn.combine(episode.reward, score)
        except RewardError as refused:
            return _failed(episode, f"{refused} (the episode failed and does not train)")
        except ScoreFailed as failure:
            return _failed(episode, f"{reward_fn.path}: {failure}")
        except Exception:  # user code: the episode fails, the run goes on (counted in episode/failed)
            return _failed(episode, f"reward_fn {reward_fn.path} raised:\n{traceback.format_exc(limit=-3)}")
        episode.reward = reward
        episode.add_metrics(score.metrics)
        if score.success is not None:
            episode.success = score.success
    _finish_samples(episode)
    return episode


def _failed(episode: Episode, error: str) -> Episode:
    """An env failure: the episode is kept for accounting but carries no training signal."""
    episode.more_samples = []
    episode.finish = "error"
    episode.error = error
    episode.reward = 0.0
    episode.loss_mask = [0] * len(episode.tokens)
    episode.turn_spans, episode.turn_rewards, episode.turn_states = [], [], []
    if not episode.tokens:
        episode.extend([0], mask=0)
    return episode


def _start_new_sample(episode: Episode, prompt_ids: list[int]) -> None:
    """chat.rewritten=new_sample: the tokens so far become a sample of their own (in `episode.more_samples`), and
    the episode goes on from `prompt_ids`, the template's rendering of the whole conversation."""
    done = Episode(
        group=episode.group, task_seed=episode.task_seed, task_id=episode.task_id, data_source=episode.data_source
    )
    for name in ("tokens", "loss_mask", "logprobs", "token_versions", "turn_spans", "turn_rewards", "turn_states"):
        setattr(done, name, getattr(episode, name))
        setattr(episode, name, [])
    done.prompt_len, done.turns = episode.prompt_len, len(done.turn_spans)
    episode.more_samples.append(done)
    episode.extend(prompt_ids, mask=0)
    episode.prompt_len = len(prompt_ids)


def _finish_samples(episode: Episode) -> None:
    """The samples a rewriting template split the episode into carry its reward, success and finish; the episode
    itself holds the last one."""
    for index, sample in enumerate(episode.more_samples, start=1):
        sample.sample = index
        sample.reward, sample.success, sample.finish = episode.reward, episode.success, episode.finish
        sample.weight_version = episode.weight_version


def _for_turn(sampling: SamplingParams, max_new_tokens: int, turn: int, last: bool = False) -> SamplingParams:
    """The turn's sampling: its token budget, with a per-episode seed (evaluation) a seed of its own per turn,
    so turns do not replay one another's random draws, and whether it is the episode's `last` turn. Made once per
    (settings, budget, turn, last) and shared, as the settings are frozen."""
    return _turn_sampling(sampling, max_new_tokens, 0 if sampling.seed is None else turn, last)


@functools.lru_cache(maxsize=4096)  # evaluation's seeds, one per episode, come and go
def _turn_sampling(sampling: SamplingParams, max_new_tokens: int, turn: int, last: bool) -> SamplingParams:
    seed = sampling.seed if sampling.seed is None or turn == 0 else turn_seed(sampling.seed, turn)
    if sampling.max_new_tokens == max_new_tokens and seed == sampling.seed and sampling.last_turn == last:
        return sampling
    return replace(sampling, max_new_tokens=max_new_tokens, seed=seed, last_turn=last)


def turn_seed(seed: int, turn: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([seed, turn]).generate_state(1)[0])


async def gather_episodes(coroutines):
    return await asyncio.gather(*coroutines)


class Stopped(Exception):
    """The trainer announced a stop while this rank's episodes were in flight; they were cancelled."""


# How often episodes in flight look for new weights while the engine runs no batch (or has no point between its
# batches to look at): a weight update waits at most this long to start (then for the running batch to end).
POLL_WEIGHTS_S = 0.002


async def gather_polling(coroutines, between_batches: Callable[[], bool], engine: Engine | None = None):
    """Run `coroutines` to the end, calling `between_batches` (False: stop them, raise Stopped) as they run: before
    each of `engine`'s batches where it calls a hook there (`Engine.watch_batches`), and every POLL_WEIGHTS_S while
    it runs none."""
    loop = asyncio.get_running_loop()
    episodes = asyncio.gather(*coroutines)
    lookout = _Lookout(episodes, between_batches)
    woken: asyncio.Future | None = None

    def at_batch() -> None:
        lookout.look()
        if woken is not None and not woken.done():
            woken.set_result(None)

    watched = engine is not None and engine.watch_batches(at_batch)
    try:
        while not episodes.done():
            if watched and engine.running_batches():  # the hook looks before each batch: wait for it to say idle
                woken = loop.create_future()
                await asyncio.wait([episodes, woken], return_when=asyncio.FIRST_COMPLETED)
            else:
                lookout.look()
                await asyncio.wait([episodes], timeout=POLL_WEIGHTS_S)
    finally:
        if watched:
            engine.watch_batches(None)
    if lookout.failure is not None or lookout.stopped:
        with contextlib.suppress(asyncio.CancelledError):
            await episodes
        if lookout.failure is not None:
            raise lookout.failure
        raise Stopped
    return episodes.result()


class _Lookout:
    """`between_batches` for episodes in flight: a stop or a failure it raises cancels them, to be reported by the
    gather (it may run inside the engine's scheduler, where raising would strand the batch's requests)."""

    def __init__(self, episodes: asyncio.Future, between_batches: Callable[[], bool]):
        self.episodes, self.between_batches = episodes, between_batches
        self.stopped = False
        self.failure: BaseException | None = None

    def look(self) -> None:
        if self.stopped or self.failure is not None:
            return
        try:
            self.stopped = not self.between_batches()
        except Exception as exc:
            self.failure = exc
        if self.stopped or self.failure is not None:
            self.episodes.cancel()
