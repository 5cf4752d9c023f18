"""Evaluation's pure parts: unbiased pass@k against hand-computed values, the aggregate, the schedule, the config's
refusals, per-turn sampling seeds, and the checks of a --checkpoint path."""

import math

import pytest

from agentrl.commands.eval import resolve_target
from agentrl.config import ConfigError, load_config
from agentrl.engine.base import SamplingParams
from agentrl.errors import UserError
from agentrl.evaluation.metrics import TaskResult, aggregate, ks_for, pass_at_k
from agentrl.rollout.agent_loop import _for_turn
from agentrl.trainer.folders import check_model_folder

QUICKSTART = "launch/configs/quickstart.yaml"


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (4, 1, 1, 1 / 4),  # pass@1 is c / n
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (8, 0, 8, 0.0),  # no success, no pass
        (8, 8, 1, 1.0),
        (6, 3, 4, 1.0),  # fewer failures (3) than k (4): every draw of 4 holds a success
        (16, 1, 16, 1.0),
        (16, 1, 8, 0.5),  # 1 - C(15,8)/C(16,8) = 1 - 8/16
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_formula_everywhere():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_ks_are_powers_of_two_up_to_n():
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]
    assert ks_for(8) == [1, 2, 4, 8]


def _task(index, successes, rewards, tool_calls=None, finish=None, source=None):
    n = len(successes)
    return TaskResult(
        index=index,
        task_id=str(index),
        data_source=source,
        rewards=rewards,
        successes=successes,
        turns=[2] * n,
        tokens=[10] * n,
        response_tokens=[3] * n,
        tool_calls=tool_calls or [0.0] * n,
        finish=finish or ["terminated"] * n,
        tool_env=tool_calls is not None,
    )


def test_aggregate_by_hand():
    tasks = [
        _task(0, [True, False, False, False], [1.0, 0.0, 0.0, 0.0], [1, 0, 2, 0], source="sum"),
        _task(1, [True, True, False, False], [1.0, 1.0, 0.5, 0.0], [1, 1, 1, 1], ["error"] + ["terminated"] * 3, "cmp"),
    ]
    m = aggregate(tasks, 4)
    assert m["tasks"] == 2 and m["episodes"] == 8 and m["failed"] == 1
    assert m["success"] == pytest.approx(3 / 8)
    assert m["reward_mean"] == pytest.approx(3.5 / 8)
    assert m["mean@4"] == pytest.approx((0.25 + 2.5 / 4) / 2)
    assert m["pass@1"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert m["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)  # C(3,2)=3, C(2,2)=1, C(4,2)=6
    assert m["pass@4"] == pytest.approx(1.0)
    assert m["tool_calls_mean"] == pytest.approx(7 / 8)
    assert m["tool_call_rate"] == pytest.approx(6 / 8)
    assert m["source/sum/success"] == pytest.approx(1 / 4)
    assert m["source/cmp/success"] == pytest.approx(2 / 4)
    assert m["turns_mean"] == 2 and m["tokens_mean"] == 10 and m["response_tokens_mean"] == 3


def test_aggregate_without_tools_has_no_tool_metrics():
    m = aggregate([_task(0, [True], [1.0])], 1)
    assert "tool_call_rate" not in m and list(k for k in m if k.startswith("pass@")) == ["pass@1"]


def test_eval_schedule():
    config = load_config(QUICKSTART, ["eval.every=3", "eval.before_train=true"])
    assert [s for s in range(10) if config.eval.due(s)] == [0, 3, 6, 9]
    config = load_config(QUICKSTART, ["eval.every=3"])
    assert [s for s in range(10) if config.eval.due(s)] == [3, 6, 9]
    assert not load_config(QUICKSTART, ["eval.every=0"]).eval.enabled
    assert load_config(QUICKSTART, ["eval.before_train=true"]).eval.due(0)


def test_eval_split_defaults_to_val_when_there_are_val_rows():
    assert load_config(QUICKSTART).eval.split_of(None) == "seeds"
    assert load_config(QUICKSTART).eval.split_of("val.jsonl") == "val"


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["eval.split=val"], "eval.split=val evaluates the rows of data.val, but data.val is not set"),
        (["eval.n=0"], "eval.n: samples per task must be at least 1"),
        (["eval.n=4"], "eval.n=4 with eval.temperature=0 (greedy)"),
        (["eval.seeds=[5,0]"], "eval.seeds: is [first seed, count]"),
        (["eval.every=-1"], "eval.every"),
    ],
)
def test_bad_eval_config_is_refused_with_the_fix(overrides, says):
    with pytest.raises(ConfigError) as error:
        load_config(QUICKSTART, overrides)
    assert says in str(error.value)


def test_each_turn_of_a_seeded_episode_samples_from_its_own_seed():
    seeded = SamplingParams(max_new_tokens=8, seed=123)
    seeds = [_for_turn(seeded, 8, turn).seed for turn in range(4)]
    assert seeds[0] == 123 and len(set(seeds)) == 4
    assert _for_turn(seeded, 8, 2).seed == _for_turn(seeded, 8, 2).seed  # a function of (seed, turn) only
    training = SamplingParams(max_new_tokens=8)
    assert _for_turn(training, 8, 3) is training  # training's requests are untouched
    assert _for_turn(training, 5, 3).seed is None


def test_a_turns_sampling_is_made_once_per_settings_budget_turn_and_last_and_equal_settings_are_not_confused():
    training = SamplingParams(max_new_tokens=8)
    last = _for_turn(training, 5, 0, last=True)
    assert (last.max_new_tokens, last.last_turn, last.seed) == (5, True, None)
    assert _for_turn(training, 5, 3, last=True) is last  # unseeded: every turn alike
    assert _for_turn(training, 5, 0, last=False) is not last and _for_turn(training, 4, 0, last=True) is not last
    other = SamplingParams(max_new_tokens=8, temperature=0.5)  # other settings: their own turn's sampling
    assert _for_turn(other, 5, 0, last=True).temperature == 0.5
    seeded = SamplingParams(max_new_tokens=8, seed=7)
    assert _for_turn(seeded, 8, 1).seed != _for_turn(seeded, 8, 2).seed
    assert _for_turn(seeded, 8, 2) is _for_turn(seeded, 8, 2)
    for seed in range(5000):  # more than the cache keeps: still each episode's own seeds
        episode = SamplingParams(max_new_tokens=8, seed=seed)
        assert _for_turn(episode, 8, 1).seed == _for_turn(SamplingParams(max_new_tokens=8, seed=seed), 8, 1).seed


def test_a_checkpoint_that_is_not_a_model_folder_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UserError, match=r"is not a model folder: it has no config\.json"):
        check_model_folder(tmp_path, str(tmp_path))
    config = load_config(QUICKSTART, [f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(UserError, match="no such folder"):
        resolve_target(config, str(tmp_path / "missing"), None)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match="run folder without a complete checkpoint"):
        resolve_target(config, str(tmp_path / "run"), None)


def test_a_run_checkpoint_reports_next_to_its_run(tiny_model_dir, tmp_path):
    import shutil

    folder = tmp_path / "run" / "checkpoints" / "step_000012"
    shutil.copytree(tiny_model_dir, folder)
    config = load_config(QUICKSTART, [f"run_dir={tmp_path / 'run'}"])
    target = resolve_target(config, str(folder), None)
    assert target.step == 12 and target.model == str(folder)
    assert target.out == str(tmp_path / "run" / "eval" / "checkpoint_step_000012")
    other = resolve_target(config, str(tiny_model_dir), str(tmp_path / "out"))
    assert other.step == 0 and other.out == str(tmp_path / "out")


@pytest.mark.parametrize("scheduler", ["batch", "continuous"])
def test_evaluation_puts_the_engines_and_global_random_streams_back_and_drops_its_kv_caches(tiny_model_dir, scheduler):
    import asyncio
    import random

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.engine.continuous import ContinuousTorchEngine
    from agentrl.engine.torch_engine import TorchEngine
    from agentrl.evaluation.runner import training_streams_kept

    engine_class = ContinuousTorchEngine if scheduler == "continuous" else TorchEngine
    engine = engine_class(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), pad_token_id=0, seed=5)

    def draws():
        return engine.generator.get_state(), random.random(), float(np.random.rand()), float(torch.rand(1))

    async def generate():
        sampling = SamplingParams(max_new_tokens=4, seed=11)
        return await asyncio.gather(*(engine.generate([1, 2, 3 + i], sampling) for i in range(3)))

    before = engine.generator.get_state().clone()
    with training_streams_kept(engine):
        asyncio.run(generate())
        random.random(), np.random.rand(), torch.rand(3)
        assert not torch.equal(engine.generator.get_state(), before)  # eval's draws moved the engine's stream
        assert scheduler == "batch" or len(engine.sessions) > 0  # KV caches kept for a next turn
    assert torch.equal(engine.generator.get_state(), before)
    if scheduler == "continuous":
        assert len(engine.sessions) == 0
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    first = draws()
    random.setstate(state[0]), np.random.set_state(state[1]), torch.set_rng_state(state[2])
    with training_streams_kept(engine):
        random.random(), np.random.rand(), torch.rand(3)
    assert draws()[1:] == first[1:]
    engine.shutdown()


def test_tool_call_rate_is_reported_for_tools_left_out_of_the_prompt():
    """calculator_rl.yaml lists no tools in the prompt (list_tools: false), yet the model calls them."""
    from agentrl.data.tasks import Task
    from agentrl.evaluation.runner import Evaluator
    from agentrl.trajectory import Episode

    task = Task(id="7", seed=7)
    called = Episode(group=0, task_seed=7, success=True, turns=2, metrics={"tool_calls": 1.0})
    answered = Episode(group=0, task_seed=7, turns=1)
    with_call = TaskResult(**Evaluator._task_result(0, task, [called, answered]))
    without = TaskResult(**Evaluator._task_result(1, task, [answered, answered]))
    m = aggregate([with_call, without], n=2)
    assert m["tool_call_rate"] == pytest.approx(1 / 4) and m["tool_calls_mean"] == pytest.approx(1 / 4)
