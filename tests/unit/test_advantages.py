import math
import statistics

import numpy as np
import pytest

from agentrl.algorithms.advantages import (
    group_advantages,
    local_sum,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from tests.unit.two_ranks import run_two_ranks


def _whiten_by_hand(values: list[float], tokens: list[int], eps: float = 1e-8) -> list[float]:
    """Independent check: expand every episode into its tokens, then plain mean and unbiased variance."""
    expanded = [v for v, n in zip(values, tokens, strict=True) for _ in range(n)]
    mean = statistics.fmean(expanded)
    var = statistics.variance(expanded) if len(expanded) > 1 else 0.0
    return [(v - mean) / math.sqrt(var + eps) for v in values]


# --- RLOO -------------------------------------------------------------------------------------


def test_rloo_leave_one_out_by_hand():
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 3.0, 2.0, 9.0, 4.0])
    groups = np.array([0, 0, 0, 0, 1, 1, 2, 3, 3, 3])
    valid = np.array([True] * 8 + [False, True])
    adv = rloo_advantages(rewards, groups, valid)
    expected = [
        1 - (0 + 0 + 0) / 3,  # group 0: the others of episode 0 all scored 0
        0 - (1 + 0 + 0) / 3,
        0 - (1 + 0 + 0) / 3,
        0 - (1 + 0 + 0) / 3,
        5 - 5,  # group 1: all equal
        5 - 5,
        0.0,  # group 2: one member, no baseline
        2 - 4,  # group 3: the invalid 9 is left out, so the other of 2 is 4
        0.0,  # invalid
        4 - 2,
    ]
    assert adv.dtype == np.float32
    np.testing.assert_allclose(adv, expected, atol=1e-6)


def test_rloo_is_scaled_group_mean_and_unordered_groups():
    rewards = np.array([0.3, 1.0, 0.2, 0.6, 0.0])
    groups = np.array([7, 2, 7, 2, 7])  # interleaved, non-contiguous ids
    adv = rloo_advantages(rewards, groups, np.ones(5, dtype=bool))
    # group 7: {0.3, 0.2, 0.0}: 0.3 - 0.1 = 0.2, 0.2 - 0.15 = 0.05, 0.0 - 0.25 = -0.25
    # group 2: {1.0, 0.6}: 1.0 - 0.6 = 0.4, 0.6 - 1.0 = -0.4
    np.testing.assert_allclose(adv, [0.2, 0.4, 0.05, -0.4, -0.25], atol=1e-6)
    # k/(k-1) times GRPO's mean-only advantage
    grpo = group_advantages(rewards, groups, std_norm=False)
    np.testing.assert_allclose(adv, grpo * np.array([1.5, 2, 1.5, 2, 1.5]), atol=1e-6)


def test_rloo_edge_cases():
    np.testing.assert_array_equal(rloo_advantages(np.array([2.0]), np.array([0]), None), [0.0])
    np.testing.assert_array_equal(rloo_advantages(np.ones(3), np.zeros(3), np.zeros(3, dtype=bool)), np.zeros(3))
    np.testing.assert_allclose(rloo_advantages(np.full(4, 0.7), np.zeros(4), None), np.zeros(4), atol=1e-7)
    assert rloo_advantages(np.zeros(0), np.zeros(0, dtype=int), None).shape == (0,)


# --- REINFORCE++ ------------------------------------------------------------------------------


def test_reinforce_pp_token_weighted_whitening_by_hand():
    rewards = np.array([1.0, 0.0, 0.5, 7.0])
    tokens = np.array([2, 1, 3, 10])
    valid = np.array([True, True, True, False])
    adv = reinforce_pp_advantages(rewards, tokens, valid, local_sum)
    # 6 tokens: mean = (2*1 + 1*0 + 3*0.5) / 6 = 7/12; deviations 5/12, -7/12, -1/12
    # var (unbiased) = (2*25 + 49 + 3*1) / 144 / (6 - 1) = 17/120
    std = math.sqrt(17 / 120 + 1e-8)
    expected = [(5 / 12) / std, (-7 / 12) / std, (-1 / 12) / std, 0.0]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(adv[:3], _whiten_by_hand([1.0, 0.0, 0.5], [2, 1, 3]), rtol=1e-6)


def test_reinforce_pp_edge_cases():
    # all-equal rewards: zero, not nan
    np.testing.assert_allclose(reinforce_pp_advantages(np.full(3, 0.7), np.array([3, 4, 5]), None), 0.0, atol=1e-5)
    # one token in the whole batch: variance taken as 0, advantage 0
    np.testing.assert_array_equal(reinforce_pp_advantages(np.array([2.0]), np.array([1]), None), [0.0])
    # no valid episode, or no token at all: zeros and no division by zero
    assert not reinforce_pp_advantages(np.ones(2), np.array([5, 5]), np.zeros(2, dtype=bool)).any()
    assert not reinforce_pp_advantages(np.array([1.0, 3.0]), np.array([0, 0]), None).any()
    # an episode without trained tokens weighs nothing in the statistics and gets 0
    with_empty = reinforce_pp_advantages(np.array([1.0, 0.0, 5.0]), np.array([2, 2, 0]), None)
    # mean 0.5, var = 4 * 0.25 / 3 = 1/3
    std = math.sqrt(1 / 3 + 1e-8)
    np.testing.assert_allclose(with_empty, [0.5 / std, -0.5 / std, 0.0], rtol=1e-6)
    with pytest.raises(ValueError, match="response_tokens"):
        reinforce_pp_advantages(np.ones(2), np.array([1, -1]), None)


def test_reinforce_pp_baseline_by_hand():
    rewards = np.array([1.0, 0.0, 0.5, 0.25, 3.0, 8.0])
    groups = np.array([0, 0, 1, 1, 2, 0])
    tokens = np.array([2, 1, 4, 2, 5, 9])
    valid = np.array([True, True, True, True, True, False])
    adv = reinforce_pp_baseline_advantages(rewards, groups, tokens, valid, local_sum)
    # group means (valid only): g0 {1, 0} -> 0.5, g1 {0.5, 0.25} -> 0.375, g2 {3} -> 3 (own mean)
    centred = [1 - 0.5, 0 - 0.5, 0.5 - 0.375, 0.25 - 0.375, 3 - 3]
    # token-weighted mean = (2*0.5 - 0.5 + 4*0.125 - 2*0.125 + 0) / 14 = 0.75 / 14
    mean = 0.75 / 14
    squares = 2 * (0.5 - mean) ** 2 + (-0.5 - mean) ** 2 + 4 * (0.125 - mean) ** 2
    squares += 2 * (-0.125 - mean) ** 2 + 5 * mean**2
    std = math.sqrt(squares / 13 + 1e-8)
    expected = [(c - mean) / std for c in centred] + [0.0]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(adv[:5], _whiten_by_hand(centred, [2, 1, 4, 2, 5]), rtol=1e-6)


def test_reinforce_pp_baseline_group_mean_counts_tokenless_episodes():
    adv = reinforce_pp_baseline_advantages(np.array([1.0, 0.0, 0.5]), np.zeros(3), np.array([2, 0, 2]), None)
    # group mean (1 + 0 + 0.5) / 3 = 0.5: centred 0.5, -0.5, 0; the tokenless episode gets 0
    # tokens: 0.5, 0.5, 0, 0 -> mean 0.25, var = 4 * 0.0625 / 3 = 1/12
    std = math.sqrt(1 / 12 + 1e-8)
    np.testing.assert_allclose(adv, [0.25 / std, 0.0, -0.25 / std], rtol=1e-6)


def test_reinforce_pp_baseline_all_equal_within_groups_is_zero():
    rewards = np.array([1.0, 1.0, 0.0, 0.0])
    adv = reinforce_pp_baseline_advantages(rewards, np.array([0, 0, 1, 1]), np.array([3, 1, 2, 2]), None)
    np.testing.assert_array_equal(adv, np.zeros(4))


@pytest.mark.parametrize("baseline", [False, True])
def test_reinforce_pp_two_ranks_equal_one_rank(baseline):
    rewards = np.array([1.0, 0.0, 0.5, 0.9, 0.1, 0.2, 0.0, 0.7])
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])  # whole groups per rank, as the rollout ranks send them
    tokens = np.array([5, 3, 8, 1, 4, 6, 2, 9])
    valid = np.array([True, True, False, True, True, True, True, False])

    def estimate(sl, reduce):
        if baseline:
            return reinforce_pp_baseline_advantages(rewards[sl], groups[sl], tokens[sl], valid[sl], reduce)
        return reinforce_pp_advantages(rewards[sl], tokens[sl], valid[sl], reduce)

    whole = estimate(slice(None), local_sum)
    halves = run_two_ranks(lambda rank, reduce: estimate(slice(0, 4) if rank == 0 else slice(4, 8), reduce))
    np.testing.assert_allclose(np.concatenate(halves), whole, rtol=1e-6, atol=1e-7)
    # and the global statistics are not the per-half ones
    assert not np.allclose(estimate(slice(0, 4), local_sum), whole[:4])


def test_reinforce_pp_rank_without_valid_episodes_still_joins_the_reductions():
    rewards, tokens = np.array([1.0, 0.0, 0.0, 0.0]), np.array([2, 2, 3, 3])
    valid = np.array([True, True, False, False])
    whole = reinforce_pp_advantages(rewards, tokens, valid)
    halves = run_two_ranks(
        lambda rank, reduce: reinforce_pp_advantages(
            rewards[2 * rank : 2 * rank + 2], tokens[2 * rank : 2 * rank + 2], valid[2 * rank : 2 * rank + 2], reduce
        )
    )
    np.testing.assert_allclose(np.concatenate(halves), whole, rtol=1e-6)
