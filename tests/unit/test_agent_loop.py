"""The agent loop: exact tokens and masks, turn closing, limits, env failures, logprob agreement."""

import asyncio

import numpy as np
import pytest
import torch

from agentrl.config import from_dict
from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.metrics import episode_metrics, episode_sums
from agentrl.models.chat_format import ChatFormat
from agentrl.models.loading import load_causal_lm, load_tokenizer
from agentrl.roles.rollout_parts import rollout_worker
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.trajectory import Episode, pack


class RecordingEngine(Engine):
    """Wraps a real engine and keeps every (input ids, output) pair it served."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    @property
    def weight_version(self):
        return self.inner.weight_version

    async def generate(self, input_ids, sampling):
        output = await self.inner.generate(input_ids, sampling)
        self.calls.append((list(input_ids), output))
        return output

    def load_weights(self, named_tensors, version):
        self.inner.load_weights(named_tensors, version)


class ScriptedEngine(Engine):
    """Returns the given token lists in order (a unit-test stand-in for an engine)."""

    def __init__(self, turns, stop_id):
        self.turns, self.stop_id = list(turns), stop_id

    async def generate(self, input_ids, sampling):
        ids = self.turns.pop(0)[: sampling.max_new_tokens]
        reason = "stop" if ids and ids[-1] == self.stop_id else "length"
        return GenerateOutput(np.array(ids), np.full(len(ids), -0.5, dtype=np.float32), reason, weight_version=3)

    def load_weights(self, named_tensors, version):
        raise NotImplementedError


def config_for(model_dir, **rollout):
    return from_dict(
        {
            "model": {"path": str(model_dir)},
            "rollout": {"tasks_per_step": 2, "group_size": 4, "max_new_tokens": 4, "max_turns": 4, **rollout},
        }
    )


def test_trainer_sees_exactly_the_engine_tokens(tiny_model_dir):
    config = config_for(tiny_model_dir)
    worker = rollout_worker(config, LocalEnvClient(EnvHost("guess_number", {})), 0, 1)
    worker.engine = recorder = RecordingEngine(worker.engine)
    episodes, _ = worker.collect(step=0)
    batch = pack(episodes)
    chat = worker.chat
    for index, episode in enumerate(episodes):
        span = slice(batch["offsets"][index], batch["offsets"][index + 1])
        tokens, mask, logprobs = batch["tokens"][span], batch["loss_mask"][span], batch["logprobs"][span]
        covered = np.zeros(len(tokens), dtype=bool)
        turns = 0
        for prompt, output in recorder.calls:
            n, m = len(prompt), len(output.output_ids)
            generated = list(output.output_ids)
            if n + m <= len(tokens) and list(tokens[:n]) == prompt and list(tokens[n : n + m]) == generated:
                covered[n : n + m] = True
                np.testing.assert_array_equal(logprobs[n : n + m], output.logprobs)
                turns += 1
        assert turns == episode.turns
        np.testing.assert_array_equal(mask.astype(bool), covered)  # mask 1 exactly on generated tokens
        assert list(tokens[: episode.prompt_len]) == chat.prompt_ids(episode.text.split("\n>>> ")[0])


def test_rollout_logprobs_match_trainer_recomputation(tiny_model_dir):
    config = config_for(tiny_model_dir, temperature=0.8)
    worker = rollout_worker(config, LocalEnvClient(EnvHost("guess_number", {})), 0, 1)
    episodes, _ = worker.collect(step=0)
    model = load_causal_lm(str(tiny_model_dir))
    diffs = []
    with torch.no_grad():
        for episode in episodes:
            ids = torch.tensor([episode.tokens])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / 0.8, -1)
            recomputed = logp.gather(1, ids[0, 1:, None]).squeeze(1).numpy()
            mask = np.array(episode.loss_mask[1:], dtype=bool)
            diffs.append(np.abs(recomputed[mask] - np.array(episode.logprobs[1:])[mask]))
    diff = np.concatenate(diffs)
    print(f"rollout vs trainer logprobs: mean abs diff {diff.mean():.2e}, max {diff.max():.2e} over {diff.size} tokens")
    assert diff.mean() < 1e-5 and diff.max() < 1e-4


@pytest.fixture
def chat(tiny_model_dir):
    return ChatFormat(load_tokenizer(str(tiny_model_dir)))


def run(engine, chat, limits, host=None, seed=1):
    host = host or EnvHost("guess_number", {"low": 1, "high": 10, "max_guesses": 4})
    sampling = SamplingParams(max_new_tokens=limits.max_new_tokens, stop_token_ids=chat.stop_ids)
    episode = Episode(group=0, task_seed=seed)
    return asyncio.run(run_episode(engine, LocalEnvClient(host), chat, EpisodeRules(sampling, limits), episode, key=0))


def test_turn_without_stop_is_closed_with_masked_eos(chat):
    tok = chat.tokenizer
    secret = EnvHost("guess_number", {}).handle("reset", 0, 1, None).value[1]["secret"]
    wrong = 1 if secret != 1 else 2
    first = tok(f"{wrong} and", add_special_tokens=False)["input_ids"]  # no stop id: closed by the loop
    second = [*tok(str(secret), add_special_tokens=False)["input_ids"], chat.eos_id]
    episode = run(ScriptedEngine([first, second], chat.eos_id), chat, EpisodeLimits(4, len(first), 400))
    assert episode.finish == "terminated" and episode.success and episode.reward == 1.0 and episode.turns == 2
    start = episode.prompt_len
    assert episode.tokens[start : start + len(first)] == first
    assert episode.loss_mask[start : start + len(first)] == [1] * len(first)
    assert episode.tokens[start + len(first)] == chat.eos_id and episode.loss_mask[start + len(first)] == 0
    assert sum(episode.loss_mask) == len(first) + len(second)
    assert episode.weight_version == 3


def test_limits_end_episodes(chat):
    guess = [*chat.tokenizer("0", add_special_tokens=False)["input_ids"], chat.eos_id]
    by_turns = run(ScriptedEngine([guess] * 3, chat.eos_id), chat, EpisodeLimits(2, 4, 400))
    assert by_turns.finish == "max_turns" and by_turns.turns == 2
    by_env = run(ScriptedEngine([guess] * 5, chat.eos_id), chat, EpisodeLimits(8, 4, 400))
    assert by_env.finish == "terminated" and by_env.turns == 4 and not by_env.success
    by_tokens = run(ScriptedEngine([guess] * 8, chat.eos_id), chat, EpisodeLimits(8, 4, 60))
    assert by_tokens.finish == "max_tokens" and len(by_tokens.tokens) <= 60


class ExplodingEnv:
    def reset(self, seed=None, options=None):
        return "go", {}

    def step(self, action):
        raise RuntimeError("tool crashed")

    def close(self):
        pass


def test_env_failure_is_contained_and_carries_no_signal(chat):
    host = EnvHost("exploding", factory=lambda _id, **kw: ExplodingEnv())
    guess = [*chat.tokenizer("5", add_special_tokens=False)["input_ids"], chat.eos_id]
    episode = run(ScriptedEngine([guess], chat.eos_id), chat, EpisodeLimits(4, 4, 400), host=host)
    assert episode.finish == "error" and "tool crashed" in episode.error
    assert sum(episode.loss_mask) == 0 and episode.reward == 0.0
    assert host.failures == 1


class RewardingEnv:
    """Never ends by itself; every step pays `reward`."""

    def __init__(self, reward):
        self.reward = reward

    def reset(self, seed=None, options=None):
        return "go", {}

    def step(self, action):
        return "again", self.reward, False, False, {}

    def close(self):
        pass


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf"), np.float32("nan"), 1e39])
def test_a_step_reward_that_is_not_finite_fails_the_episode_and_closes_its_env(chat, reward):
    host = EnvHost("rewarding", factory=lambda _id, **kw: RewardingEnv(reward))
    guess = [*chat.tokenizer("5", add_special_tokens=False)["input_ids"], chat.eos_id]
    episode = run(ScriptedEngine([guess] * 4, chat.eos_id), chat, EpisodeLimits(4, 4, 400), host=host)
    assert episode.finish == "error" and "the env's step reward must be a finite number, got" in episode.error
    assert sum(episode.loss_mask) == 0 and episode.reward == 0.0 and episode.turn_rewards == []
    assert host.counts()["open"] == 0  # closed, not left behind
    assert episode_metrics(episode_sums(pack([episode]), version=0))["episode/failed"] == 1.0


@pytest.mark.parametrize("reward", [True, "1.0", None, [1.0]])
def test_a_step_reward_that_is_no_number_fails_the_episode(chat, reward):
    host = EnvHost("rewarding", factory=lambda _id, **kw: RewardingEnv(reward))
    guess = [*chat.tokenizer("5", add_special_tokens=False)["input_ids"], chat.eos_id]
    episode = run(ScriptedEngine([guess] * 4, chat.eos_id), chat, EpisodeLimits(4, 4, 400), host=host)
    assert episode.finish == "error" and f"must be a finite number, got {reward!r}" in episode.error
    assert host.counts()["open"] == 0
