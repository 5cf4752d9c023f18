"""DAPO: the overlong soft penalty (hand-computed), keep_group, and its advantages on a packed batch."""

import numpy as np
import pytest

from agentrl.algorithms import AlgorithmContext, make_algorithm
from agentrl.algorithms.advantages import group_advantages
from agentrl.algorithms.dapo import DAPO, overlong_penalty
from agentrl.config import ConfigError, from_dict
from agentrl.trajectory import Episode, pack


def dapo(**options) -> DAPO:
    config = from_dict(
        {
            "model": {"path": "unused"},
            "rollout": {"max_new_tokens": 4, "max_turns": 3, "max_episode_tokens": 64},
            "algorithm": {"name": "dapo", **options},
        }
    )
    algorithm = make_algorithm(config, AlgorithmContext(config=config, reduce=lambda a: a))
    assert isinstance(algorithm, DAPO)
    return algorithm


def test_overlong_penalty_by_hand():
    # L_max 10, L_cache 4: free up to 6 tokens, then -1/4 per token, -1 at 10 and beyond (DAPO eq. 13).
    generated = np.array([0, 6, 7, 8, 9, 10, 11, 50])
    np.testing.assert_allclose(overlong_penalty(generated, 10, 4), [0, 0, -0.25, -0.5, -0.75, -1, -1, -1])
    np.testing.assert_allclose(overlong_penalty(generated, 10, 4, factor=0.5)[2:4], [-0.125, -0.25])
    assert not overlong_penalty(generated, 10, 0).any()  # buffer 0: off


def episode(group: int, reward: float, generated: int, prompt: int = 3, finish: str = "terminated") -> Episode:
    e = Episode(group=group, task_seed=0, reward=reward, finish=finish)
    e.extend(range(prompt), mask=0)
    e.extend(range(generated), mask=1)
    e.extend([0, 0], mask=0)  # an observation between turns: not generated
    return e


def test_penalty_counts_generated_tokens_and_shifts_rewards():
    algorithm = dapo(overlong_buffer=4)  # L_max defaults to max_new_tokens x max_turns = 12; free up to 8
    assert algorithm.overlong_max_tokens == 12
    batch = pack([episode(0, 1.0, 8), episode(0, 1.0, 10), episode(1, 0.0, 12), episode(1, 0.5, 20, prompt=40)])
    np.testing.assert_allclose(algorithm.shaped_rewards(batch), [1.0, 0.5, -1.0, -0.5])
    valid = np.ones(4, dtype=bool)
    expected = group_advantages(np.array([1.0, 0.5, -1.0, -0.5]), batch["group"], valid)
    np.testing.assert_allclose(algorithm.episode_advantages(batch, valid), expected)
    tokens = algorithm.advantages(batch, valid)
    assert tokens.shape == batch["tokens"].shape and tokens[batch["offsets"][1]] == expected[1]


def test_explicit_max_tokens_and_factor():
    algorithm = dapo(overlong_buffer=2, overlong_max_tokens=6, overlong_penalty_factor=2.0)
    batch = pack([episode(0, 0.0, 4), episode(0, 0.0, 5), episode(0, 0.0, 9)])
    np.testing.assert_allclose(algorithm.shaped_rewards(batch), [0.0, -1.0, -2.0])


def test_without_penalty_advantages_equal_grpo():
    algorithm = dapo()
    batch = pack([episode(0, 1.0, 50), episode(0, 0.0, 1), episode(1, 0.3, 2), episode(1, 0.1, 70)])
    valid = np.array([True, True, True, False])
    np.testing.assert_array_equal(
        algorithm.episode_advantages(batch, valid), group_advantages(batch["reward"], batch["group"], valid)
    )


def test_keep_group_needs_two_different_rewards():
    algorithm = dapo()
    keep = algorithm.keep_group
    assert keep(np.array([0.0, 1.0, 1.0], np.float32)) and keep(np.array([0.2, 0.1], np.float32))
    assert not keep(np.array([1.0, 1.0, 1.0], np.float32)) and not keep(np.array([0.0, 0.0], np.float32))
    assert not keep(np.array([1.0], np.float32)) and not keep(np.array([], np.float32))  # <2 valid episodes
    assert algorithm.max_extra_rounds == 3 and dapo(max_extra_rounds=0).max_extra_rounds == 0


def test_dapo_defaults_are_the_papers_and_options_are_checked():
    options = dapo().options
    assert (options.clip_eps_low, options.clip_eps_high, options.loss_agg) == (0.2, 0.28, "token-mean")
    with pytest.raises(ConfigError, match=r"algorithm\.overlong_bufer"):
        from_dict({"model": {"path": "x"}, "algorithm": {"name": "dapo", "overlong_bufer": 4}})


def test_an_empty_shard_trains_without_moving_the_weights(tiny_model_dir):
    import torch

    from agentrl.roles.trainer_parts import policy_trainer

    config = from_dict({"model": {"path": str(tiny_model_dir)}, "algorithm": {"name": "dapo"}})
    trainer = policy_trainer(config, str(tiny_model_dir), "cpu")
    before = [p.detach().clone() for p in trainer.params]
    metrics = trainer.train_step(pack([]))  # every group of the step was dropped
    assert metrics["train/loss"] == 0.0 and metrics["train/grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.params, strict=True))  # no optimizer step
    assert trainer.scheduler.last_epoch == 0
