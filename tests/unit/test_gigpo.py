import math

import numpy as np
import pytest

from agentrl.algorithms.advantages import group_advantages
from agentrl.algorithms.gigpo import Turns, _group_relative, discounted_turn_returns, gigpo_advantages

A, B, C, D = 11, 22, 33, 44  # state hashes

# episode 0 (task 0, reward 1): states A, B, C, turn rewards 0, 0, 1
# episode 1 (task 0, reward 0): states A, B, B (it looped), turn rewards 0, 0, 0
# episode 2 (task 0, FAILED, reward 5): state A, reward 5
# episode 3 (task 1, reward 1): states A, D, rewards 0, 1
REWARDS = np.array([1.0, 0.0, 5.0, 1.0])
GROUPS = np.array([0, 0, 0, 1])
VALID = np.array([True, True, False, True])
TURN_EPISODE = np.array([0, 0, 0, 1, 1, 1, 2, 3, 3])
TURN_STATE = np.array([A, B, C, A, B, B, A, A, D], dtype=np.int64)
TURN_REWARD = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 5.0, 0.0, 1.0])


def _gigpo(**overrides):
    args = dict(
        rewards=REWARDS,
        groups=GROUPS,
        valid=VALID,
        turn_episode=TURN_EPISODE,
        turn_state=TURN_STATE,
        turn_reward=TURN_REWARD,
        gamma=0.5,
        step_weight=1.0,
        std_norm=False,
    )
    args.update(overrides)
    args["turns"] = Turns(args.pop("turn_episode"), args.pop("turn_state"), args.pop("turn_reward"))
    return gigpo_advantages(**args)


def test_discounted_returns_restart_at_each_episode():
    returns = discounted_turn_returns(TURN_EPISODE, TURN_REWARD, 0.5)
    # ep0: 0.25, 0.5, 1; ep1: 0, 0, 0; ep2: 5; ep3: 0.5, 1
    np.testing.assert_allclose(returns, [0.25, 0.5, 1.0, 0.0, 0.0, 0.0, 5.0, 0.5, 1.0])


def test_gigpo_mean_norm_by_hand():
    adv = _gigpo()
    # episode level (task 0 valid {1, 0}): +0.5, -0.5; task 1 has one episode: 0; failed: 0
    # step groups (task, state), valid turns only:
    #   (0, A): returns 0.25 (ep0), 0 (ep1): mean 0.125 -> +0.125, -0.125 (the failed ep2's A is left out)
    #   (0, B): 0.5 (ep0), 0 and 0 (ep1 twice): mean 1/6 -> 1/3, -1/6, -1/6
    #   (0, C), (1, A), (1, D): one turn each -> 0 (task 1's A is not task 0's A)
    expected = [
        0.5 + 0.125,
        0.5 + 1 / 3,
        0.5 + 0.0,
        -0.5 - 0.125,
        -0.5 - 1 / 6,
        -0.5 - 1 / 6,
        0.0,
        0.0,
        0.0,
    ]
    assert adv.dtype == np.float32 and adv.shape == (9,)
    np.testing.assert_allclose(adv, expected, atol=1e-6)


def test_gigpo_step_weight():
    adv = _gigpo(step_weight=0.5)
    expected = [0.5 + 0.0625, 0.5 + 1 / 6, 0.5, -0.5 - 0.0625, -0.5 - 1 / 12, -0.5 - 1 / 12, 0.0, 0.0, 0.0]
    np.testing.assert_allclose(adv, expected, atol=1e-6)
    np.testing.assert_allclose(_gigpo(step_weight=0.0)[:6], [0.5] * 3 + [-0.5] * 3, atol=1e-6)


def test_gigpo_mean_std_norm_by_hand():
    adv = _gigpo(std_norm=True)
    eps = 1e-6
    episode = 0.5 / (0.5 + eps)  # task 0: {1, 0}, population std 0.5
    a = 0.125 / (0.125 + eps)  # (0, A): {0.25, 0}, std 0.125
    std_b = math.sqrt(((0.5 - 1 / 6) ** 2 + 2 * (1 / 6) ** 2) / 3)  # (0, B): {0.5, 0, 0}, = sqrt(1/18)
    b_hi, b_lo = (1 / 3) / (std_b + eps), (-1 / 6) / (std_b + eps)  # about 1.414 and -0.707
    expected = [episode + a, episode + b_hi, episode, -episode - a, -episode + b_lo, -episode + b_lo, 0, 0, 0]
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)


def test_gigpo_edge_cases():
    # gamma 0: the step return is the turn's own reward
    adv = _gigpo(gamma=0.0)
    # (0, A): {0, 0} -> 0; (0, B): {0, 0, 0} -> 0
    np.testing.assert_allclose(adv, [0.5, 0.5, 0.5, -0.5, -0.5, -0.5, 0, 0, 0], atol=1e-6)
    # all rewards equal: zero everywhere
    flat = _gigpo(rewards=np.ones(4), turn_reward=np.zeros(9), std_norm=True)
    np.testing.assert_array_equal(flat, np.zeros(9))
    # every episode failed
    assert not _gigpo(valid=np.zeros(4, dtype=bool)).any()
    # no turns at all
    empty = _gigpo(turn_episode=np.zeros(0, int), turn_state=np.zeros(0, np.int64), turn_reward=np.zeros(0))
    assert empty.shape == (0,)
    # one episode per task: both levels are groups of one
    turns = Turns(np.array([0, 0]), np.array([A, A]), np.array([0.0, 1.0]))
    single = gigpo_advantages(np.array([1.0]), np.array([0]), None, turns, 1.0)
    # its two turns share state A (a revisit): returns 1, 1 -> 0 as well
    np.testing.assert_array_equal(single, [0.0, 0.0])


def test_gigpo_rejects_malformed_turns():
    with pytest.raises(ValueError, match="contiguous"):
        _gigpo(turn_episode=np.array([0, 1, 0, 1, 1, 1, 2, 3, 3]))
    with pytest.raises(ValueError, match="index"):
        _gigpo(turn_episode=np.array([0, 0, 0, 1, 1, 1, 2, 3, 4]))
    with pytest.raises(ValueError, match="one entry per turn"):
        _gigpo(turn_reward=np.zeros(8))


def test_vectorised_group_normalisation_equals_grpo():
    rng = np.random.default_rng(0)
    values = rng.normal(size=40)
    ids = rng.integers(0, 9, size=40)
    valid = rng.random(40) > 0.2
    for std_norm in (False, True):
        np.testing.assert_allclose(
            _group_relative(values, ids, valid, std_norm), group_advantages(values, ids, valid, std_norm), atol=1e-6
        )
