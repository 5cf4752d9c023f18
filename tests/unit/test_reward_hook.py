"""Reward functions named in the config, tool-call metrics, and check-env's step-after-the-end check."""

import asyncio
import string

import numpy as np
import pytest

from agentrl.engine.base import SamplingParams
from agentrl.env.check import check_env
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.metrics import episode_metrics, episode_sums
from agentrl.models.chat_format import ChatFormat
from agentrl.models.tiny import build_tokenizer
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.rollout.reward_hook import ARGUMENTS, RewardFunction
from agentrl.trajectory import Episode, RewardError, pack
from envs.guess_number import GuessNumberEnv
from tests.unit import reward_fns
from tests.unit.test_agent_loop import ScriptedEngine
from tests.unit.test_tool_episodes import call


@pytest.fixture(scope="module")
def chat():
    tokenizer = build_tokenizer([string.printable, "calculator tool_call tool_response expression"], vocab_size=200)
    return ChatFormat(tokenizer)


def calculator_episode(chat, turns, reward_fn=None, seed=7):
    """Run one calculator episode whose turns are the given texts; returns (episode, reset info)."""
    host = EnvHost("calculator", {})
    _, info, _ = host.handle("reset", "peek", seed, None).value
    token_turns = [[*chat.tokenizer(t(info), add_special_tokens=False)["input_ids"], chat.eos_id] for t in turns]
    episode = Episode(group=0, task_seed=seed)
    engine = ScriptedEngine(token_turns, chat.eos_id)
    sampling = SamplingParams(max_new_tokens=400, stop_token_ids=chat.stop_ids)
    limits = EpisodeLimits(6, 400, 3000)
    asyncio.run(run_episode(engine, LocalEnvClient(host), chat, EpisodeRules(sampling, limits, reward_fn), episode, 0))
    return episode, info


def test_reward_fn_replaces_or_adds_and_can_set_success(chat):
    right = [lambda info: call("1 + 1"), lambda info: f"It is {info['answer']}"]
    wrong = [lambda info: "It is 100000"]
    replace = RewardFunction("tests.unit.reward_fns:exact_answer", "replace")
    add = RewardFunction("tests.unit.reward_fns:exact_answer", "add")

    episode, _ = calculator_episode(chat, right, replace)
    assert episode.reward == 2.0 and episode.success and episode.finish == "terminated"
    episode, _ = calculator_episode(chat, right, add)
    assert episode.reward == 3.0  # env's 1.0 + 2.0
    episode, _ = calculator_episode(chat, wrong, replace)
    assert episode.reward == -1.0 and not episode.success


def test_reward_fn_gets_every_argument_it_asks_for(chat):
    episode, info = calculator_episode(
        chat, [lambda i: call("2 * 3"), lambda i: f"{i['answer']}"], RewardFunction("tests.unit.reward_fns:everything")
    )
    seen = reward_fns.everything.seen
    assert set(seen) == set(ARGUMENTS)
    assert seen["answer"] == info["answer"] and seen["completion"] == info["answer"]
    assert seen["env_reward"] == 1.0 and seen["finish"] == "terminated" and seen["info"]["success"]
    assert len(seen["transcript"]) == 2 and "<tool_response>\n6\n</tool_response>" in seen["transcript"][0][1]
    assert seen["task"] == episode.text.split("\n>>> ")[0]
    assert episode.reward == 0.5


def test_a_raising_reward_fn_fails_only_its_episode(chat):
    episode, _ = calculator_episode(chat, [lambda i: "1"], RewardFunction("tests.unit.reward_fns:broken"))
    assert episode.finish == "error" and "ZeroDivisionError: bug in the reward" in episode.error
    assert episode.reward == 0.0 and sum(episode.loss_mask) == 0


@pytest.mark.parametrize("name", ["nan_reward", "infinite_in_a_dict"])
def test_a_reward_fn_reward_that_is_not_finite_fails_only_its_episode(chat, name):
    episode, _ = calculator_episode(chat, [lambda i: "1"], RewardFunction(f"tests.unit.reward_fns:{name}"))
    assert episode.finish == "error" and episode.reward == 0.0 and sum(episode.loss_mask) == 0
    assert f"reward_fn tests.unit.reward_fns:{name}'s reward" in episode.error
    assert "must be a finite number, got" in episode.error and "does not train" in episode.error


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.unit.reward_fns:needs_unknown", "requires argument 'gold_label'"),
        ("tests.unit.reward_fns:missing", "has no attribute 'missing'"),
        ("tests.unit.no_such_module:f", "cannot import module 'tests.unit.no_such_module'"),
        ("tests.unit.reward_fns", "must look like 'package.module:name'"),
    ],
)
def test_bad_reward_fn_paths_are_clear_errors(path, message):
    with pytest.raises((TypeError, ImportError, AttributeError, ValueError), match=message):
        RewardFunction(path)


def test_a_reward_fn_returning_text_is_an_error():
    with pytest.raises(RewardError, match=r"reward_fn tests.unit.reward_fns:returns_text's reward .* must be a finite"):
        RewardFunction("tests.unit.reward_fns:returns_text")(completion="x")


def test_tool_calls_and_errors_reach_the_trainer_metrics(chat):
    turns = [lambda i: call("1 / 0"), lambda i: call("6 * 7") + call("2 +"), lambda i: i["answer"]]
    episode, _ = calculator_episode(chat, turns)
    assert episode.metrics == {"tool_calls": 3, "tool_errors": 2}
    quiet, _ = calculator_episode(chat, [lambda i: i["answer"]])
    batch = pack([episode, quiet])
    np.testing.assert_array_equal(batch["metric/tool_calls"], [3, 0])
    metrics = episode_metrics(episode_sums(batch, version=0))
    assert metrics["episode/tool_calls_mean"] == 1.5 and metrics["episode/tool_errors_mean"] == 1.0
    assert metrics["episode/tool_error_rate"] == pytest.approx(2 / 3)


class KeepsGoing(GuessNumberEnv):
    """Ends after one guess but happily takes more."""

    def step(self, action):
        self.over = False
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, self.guesses == 1, truncated, info


def test_check_env_flags_stepping_after_the_end():
    problems = check_env("tests.unit.test_reward_hook:KeepsGoing", {"max_guesses": 50})
    assert any("step() after the episode ended" in p for p in problems)
    assert check_env("guess_number", {}) == [] and check_env("calculator", {}) == []
    env = GuessNumberEnv(max_guesses=1)
    env.reset(seed=0)
    env.step("1")
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("2")


def test_rollout_worker_applies_the_configured_reward_fn(tiny_model_dir):
    from agentrl.config import from_dict
    from agentrl.roles.rollout_parts import rollout_worker

    def collect(**env):
        config = from_dict(
            {
                "model": {"path": str(tiny_model_dir)},
                "env": {"id": "guess_number", **env},
                "rollout": {"tasks_per_step": 2, "group_size": 4, "max_new_tokens": 4, "max_turns": 4},
            }
        )
        return rollout_worker(config, LocalEnvClient(EnvHost("guess_number", {})), 0, 1).collect(step=0)[0]

    plain = collect()
    shaped = collect(reward_fn="tests.unit.reward_fns:turns_penalty", reward_mode="replace")
    assert [e.tokens for e in plain] == [e.tokens for e in shaped]  # same seeds, same episodes
    for a, b in zip(plain, shaped, strict=True):
        assert b.reward == pytest.approx(a.reward - 0.01 * a.turns)


def test_each_kind_of_episode_error_is_printed_once(capsys):
    from agentrl.rollout.worker import RolloutWorker, error_kind

    assert error_kind("env step failed: RuntimeError: fault for seed 12\ntb") == error_kind(
        "env step failed: RuntimeError: fault for seed 7\nother"
    )
    worker = RolloutWorker.__new__(RolloutWorker)  # report_errors needs only errors_seen
    worker.errors_seen = set()
    failed = [Episode(0, s, error=f"env step failed: RuntimeError: fault for seed {s}\ntraceback") for s in (3, 6)]
    worker.report_errors(0, [*failed, Episode(0, 1)])
    worker.report_errors(1, failed)
    printed = capsys.readouterr().err
    assert printed.count("episode(s) failed") == 1 and "step 0: 2 episode(s) failed" in printed
