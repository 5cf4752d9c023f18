"""The GiGPO algorithm: per-turn advantages on each turn's generated tokens, state keys from the envs."""

import asyncio

import numpy as np

from agentrl.algorithms import AlgorithmContext, make_algorithm
from agentrl.algorithms.gigpo import GiGPO, Turns, gigpo_advantages, per_turn_tokens, turn_rewards_with_final
from agentrl.config import from_dict
from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.models.chat_format import ChatFormat
from agentrl.models.loading import load_tokenizer
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.trajectory import Episode, pack, state_key


def gigpo(**options) -> GiGPO:
    config = from_dict({"model": {"path": "unused"}, "algorithm": {"name": "gigpo", **options}})
    algorithm = make_algorithm(config, AlgorithmContext(config=config, reduce=lambda a: a))
    assert isinstance(algorithm, GiGPO)
    return algorithm


def episode(group, turns, reward=None, finish="terminated"):
    """turns: [(generated tokens, turn reward, state)]; a 2-token prompt and a 1-token observation between turns."""
    e = Episode(group=group, task_seed=0, finish=finish)
    e.extend([7, 7], mask=0)
    for index, (generated, turn_reward, state) in enumerate(turns):
        if index:
            e.extend([8], mask=0)
        e.turn_states.append(state_key(state))
        start = len(e.tokens)
        e.extend([9] * generated, mask=1)
        e.turn_spans.append((start, len(e.tokens)))
        e.turn_rewards.append(turn_reward)
    e.reward = sum(e.turn_rewards) if reward is None else reward
    e.turns = len(turns)
    return e


def test_per_token_placement_by_hand():
    # A: rewards 0 then 1 via states s0, s1; B: 0, 0 via s0, s2. Mean-only normalisation, gamma 1:
    # episode level A +0.5, B -0.5; step group s0 holds A's return 1 and B's 0 -> +0.5 / -0.5; s1, s2 alone -> 0.
    a = episode(0, [(2, 0.0, "s0"), (3, 1.0, "s1")])
    b = episode(0, [(1, 0.0, "s0"), (2, 0.0, "s2")])
    batch = pack([a, b])
    advantages = gigpo(gamma=1.0, std_norm=False).advantages(batch, np.ones(2, dtype=bool))
    expected_a = [0, 0, 1.0, 1.0, 0, 0.5, 0.5, 0.5]  # prompt, turn 1, observation, turn 2
    expected_b = [0, 0, -1.0, 0, -0.5, -0.5]
    np.testing.assert_allclose(advantages, expected_a + expected_b)
    assert advantages.dtype == np.float32 and advantages.shape == batch["tokens"].shape
    assert not advantages[batch["loss_mask"] == 0].any()  # nothing on prompt or observation tokens


def test_advantages_are_the_math_modules_per_turn_values():
    episodes = [
        episode(0, [(1, 0.1, 3), (2, 0.0, 5), (1, 1.0, 6)]),
        episode(0, [(2, 0.1, 3), (1, 0.0, 4)]),
        episode(0, [(1, 0.0, 3)], finish="error"),
        episode(1, [(3, 0.0, 3), (1, 0.5, 4)]),
        episode(1, [(1, 0.0, 3), (2, 0.1, 4)]),
    ]
    batch = pack(episodes)
    valid = np.array([True, True, False, True, True])
    turns = Turns(batch["turn_episode"], batch["turn_state"], batch["turn_reward"])
    per_turn = gigpo_advantages(batch["reward"], batch["group"], valid, turns, gamma=0.9, step_weight=0.5)
    advantages = gigpo(gamma=0.9, step_weight=0.5).advantages(batch, valid)
    for turn, (start, end) in enumerate(zip(batch["turn_start"], batch["turn_end"], strict=True)):
        np.testing.assert_array_equal(advantages[start:end], per_turn[turn])
    inside = np.zeros(len(advantages), dtype=bool)
    for start, end in zip(batch["turn_start"], batch["turn_end"], strict=True):
        inside[start:end] = True
    assert not advantages[~inside].any()
    assert np.abs(per_turn).sum() > 0


def test_per_turn_tokens_handles_no_turns():
    assert per_turn_tokens(np.zeros(0), np.zeros(0, int), np.zeros(0, int), 5).tolist() == [0.0] * 5


def test_a_reward_fn_score_counts_as_the_last_turns_reward():
    scored = episode(0, [(1, 0.1, 0), (1, 0.0, 1)], reward=1.1)  # reward_fn added 1.0 at the end
    plain = episode(0, [(1, 0.1, 0), (1, 0.2, 1)])
    rewards = turn_rewards_with_final(pack([scored, plain]))
    np.testing.assert_allclose(rewards, [0.1, 1.0, 0.1, 0.2], rtol=1e-6)
    assert rewards[3] == np.float32(0.2)  # float32 rounding of the sum is not a score


class Guesses(Engine):
    def __init__(self, turns):
        self.turns = list(turns)

    async def generate(self, input_ids, sampling):
        ids = self.turns.pop(0)
        return GenerateOutput(np.array(ids), np.zeros(len(ids), np.float32), "stop")

    def load_weights(self, named_tensors, version):
        raise NotImplementedError


def test_turns_carry_the_envs_state_keys(tiny_model_dir):
    chat = ChatFormat(load_tokenizer(str(tiny_model_dir)))
    host = EnvHost("guess_number", {"low": 1, "high": 10, "max_guesses": 4}, call_timeout_s=None)
    secret = host.handle("reset", 0, 1, None).value[1]["secret"]
    wrong = 1 if secret > 1 else 10

    def say(number):
        return [*chat.tokenizer(str(number), add_special_tokens=False)["input_ids"], chat.eos_id]

    sampling = SamplingParams(max_new_tokens=4, stop_token_ids=chat.stop_ids)
    e = Episode(group=0, task_seed=1)
    engine = Guesses([say(wrong), say(secret)])
    asyncio.run(
        run_episode(engine, LocalEnvClient(host), chat, EpisodeRules(sampling, EpisodeLimits(4, 4, 400)), e, key=1)
    )
    assert e.success and e.turns == 2
    after = (2, 10, 3) if wrong == 1 else (1, 9, 3)  # the range left and the guesses left
    assert e.turn_states == [state_key((1, 10, 4)), state_key(after)]


def test_toy_text_state_key_is_the_gymnasium_state():
    host = EnvHost("frozen_lake", {"brief": True, "max_invalid": 3}, call_timeout_s=None)
    _, info, _ = host.handle("reset", 0, 0, None).value
    assert info["state_key"] == 0
    *_, info = host.handle("step", 0, "2").value  # right
    assert info["state_key"] == 1
    *_, info = host.handle("step", 0, "fly").value  # invalid: same state, different text
    assert info["state_key"] == 1 and info["invalid_action"]


def test_without_the_step_level_it_trains_as_grpo():
    from agentrl.algorithms.grpo import GRPO

    episodes = [
        episode(0, [(1, 0.1, 3), (2, 0.0, 5), (1, 1.0, 6)]),
        episode(0, [(2, 0.1, 3), (1, 0.0, 4)]),
        episode(1, [(3, 0.0, 3), (1, 0.5, 4)]),
        episode(1, [(1, 0.0, 3), (2, 0.1, 4)]),
    ]
    batch = pack(episodes)
    valid = np.ones(4, dtype=bool)
    config = from_dict({"model": {"path": "unused"}})
    grpo = GRPO(config.algorithm, AlgorithmContext(config=config, reduce=lambda a: a))
    trained = batch["loss_mask"] == 1  # the loss sees advantages only where the mask is 1
    np.testing.assert_array_equal(
        gigpo(step_weight=0.0).advantages(batch, valid)[trained], grpo.advantages(batch, valid)[trained]
    )
