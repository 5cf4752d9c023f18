"""turn_rloo: per-turn reward-to-go minus a leave-one-out baseline per turn position, against hand-computed values,
and its expectation against the exact policy gradient of a small MDP whose episode length the policy picks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from agentrl.algorithms import algorithm_of
from agentrl.algorithms.advantages import local_sum
from agentrl.algorithms.turn_rloo import episode_turns, turn_loo_advantages, turn_returns
from agentrl.config import from_dict
from agentrl.trajectory import Episode, pack


def test_a_tiny_batch_matches_the_hand_computed_advantages():
    # group 0: episode 0 pays [0.5, 1] (returns 1.5, 1), episode 1 pays [1] (return 1), episode 2 pays
    # [0.25, 0.25, 0] (returns 0.5, 0.25, 0), episode 3 failed; group 1: episode 4 pays [1], alone.
    # Turns given out of order, episode 2's turns at positions 0, 1, 3 (a call index may skip one).
    groups = np.array([0, 0, 0, 0, 1])
    valid = np.array([True, True, True, False, True])
    turn_episode = np.array([0, 2, 0, 1, 2, 2, 3, 4])
    position = np.array([1, 0, 0, 0, 3, 1, 0, 0])
    reward = np.array([1.0, 0.25, 0.5, 1.0, 0.0, 0.25, 9.0, 1.0])
    advantages = turn_loo_advantages(groups, valid, turn_episode, position, reward)
    # position 0 of group 0: returns 1.5, 1, 0.5 -> each minus the mean of the other two
    # position 1: episode 0's 1 and episode 2's 0.25 -> each minus the other
    # position 3: only episode 2 (return 0): baseline 0. The failed episode: 0. A group of one: its return.
    expected = [1 - 0.25, 0.5 - 1.25, 1.5 - 0.75, 1 - 1.0, 0.0, 0.25 - 1, 0.0, 1.0]
    np.testing.assert_allclose(advantages, expected, atol=1e-7)
    assert advantages.dtype == np.float32
    # padded: the two other valid episodes of group 0 always count, one without a turn there with a return of 0
    padded = turn_loo_advantages(groups, valid, turn_episode, position, reward, baseline="padded")
    expected = [1 - 0.125, 0.5 - 1.25, 1.5 - 0.75, 1 - 1.0, 0.0 - 0.0, 0.25 - 0.5, 0.0, 1.0]
    np.testing.assert_allclose(padded, expected, atol=1e-7)


def test_returns_are_discounted_in_position_order():
    returns = turn_returns(np.array([0, 0, 0, 1]), np.array([2, 0, 1, 0]), np.array([4.0, 1.0, 2.0, 3.0]), 0.5)
    np.testing.assert_allclose(returns, [4.0, 1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 3.0])


def test_two_turns_at_one_position_or_bad_indices_are_refused():
    with pytest.raises(ValueError, match="two turns at the same position"):
        turn_loo_advantages(np.array([0]), None, np.array([0, 0]), np.array([1, 1]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="must index the 1 episodes"):
        turn_loo_advantages(np.array([0]), None, np.array([1]), np.array([0]), np.array([1.0]))
    with pytest.raises(ValueError, match="baseline must be 'reached' or 'padded'"):
        turn_loo_advantages(np.array([0]), None, np.array([0]), np.array([0]), np.array([1.0]), baseline="mean")
    with pytest.raises(ValueError, match="one entry per turn"):
        turn_loo_advantages(np.array([0]), None, np.array([0]), np.array([0, 1]), np.array([1.0]))
    assert turn_loo_advantages(np.array([0]), None, np.zeros(0), np.zeros(0), np.zeros(0)).shape == (0,)


# ---- unbiasedness, exactly: every outcome of a group of episodes enumerated --------------------------------------
# An MDP whose length the policy chooses: at turn t (0, 1, 2) the agent stops (action 0) or goes on (action 1);
# stopping ends the episode, and turn 2 ends it whatever the action. Rewards per (turn, action). The policy is
# tabular, pi(go | t) = sigmoid(theta_t), so grad log pi(a_t) is (a_t - sigmoid(theta_t)) on coordinate t.

THETA = np.array([0.3, -0.4, 0.8])
REWARD = {(0, 0): 0.2, (0, 1): 0.1, (1, 0): 1.0, (1, 1): -0.3, (2, 0): 0.4, (2, 1): 1.5}


def trajectories():
    """(probability, actions) of every episode."""
    go = 1 / (1 + np.exp(-THETA))
    out = []
    for actions in ([0], [1, 0], [1, 1, 0], [1, 1, 1]):
        p = np.prod([go[t] if a else 1 - go[t] for t, a in enumerate(actions)])
        out.append((p, actions))
    return out


def score(t: int, action: int) -> np.ndarray:
    grad = np.zeros(len(THETA))
    grad[t] = action - 1 / (1 + np.exp(-THETA[t]))
    return grad


def true_gradient() -> np.ndarray:
    return sum(
        p * sum(REWARD[t, a] for t, a in enumerate(actions)) * sum(score(t, a) for t, a in enumerate(actions))
        for p, actions in trajectories()
    )


def expected_estimate(advantages_of, group_size: int, per_episode_weight=lambda turns: 1.0) -> np.ndarray:
    """E[(1/K) sum_i w(T_i) sum_t A_it grad log pi(a_it)] over every group of `group_size` episodes."""
    total = np.zeros(len(THETA))
    for group in itertools.product(trajectories(), repeat=group_size):
        p = np.prod([prob for prob, _ in group])
        turn_episode = np.array([i for i, (_, actions) in enumerate(group) for _ in actions])
        position = np.array([t for _, actions in group for t in range(len(actions))])
        reward = np.array([REWARD[t, a] for _, actions in group for t, a in enumerate(actions)])
        actions = [a for _, acts in group for a in acts]
        advantages = advantages_of(np.zeros(group_size, int), turn_episode, position, reward)
        lengths = np.bincount(turn_episode, minlength=group_size)
        estimate = sum(
            per_episode_weight(lengths[i]) * advantages[m] * score(position[m], actions[m])
            for m, i in enumerate(turn_episode)
        )
        total += p * estimate / group_size
    return total


def self_included(groups, turn_episode, position, reward):
    """The same, but each position's baseline includes the episode's own return (a group mean, GRPO-style)."""
    returns = turn_returns(turn_episode, position, reward, 1.0)
    means = {t: returns[position == t].mean() for t in np.unique(position)}
    return returns - np.array([means[t] for t in position])


@pytest.mark.parametrize("baseline", ["reached", "padded"])
@pytest.mark.parametrize("group_size", [2, 3])
def test_the_expected_estimate_is_the_policy_gradient_when_the_policy_picks_the_length(group_size, baseline):
    exact = true_gradient()
    assert np.abs(exact).min() > 0.01  # every coordinate has a gradient to get right
    estimate = expected_estimate(
        lambda *turns: turn_loo_advantages(*turns[:1], None, *turns[1:], baseline=baseline), group_size
    )
    np.testing.assert_allclose(estimate, exact, rtol=1e-6, atol=1e-8)  # the advantages are float32
    # what the test can tell apart: a baseline that includes the episode itself, and dividing an episode's terms by
    # its own number of turns (a per-sequence mean), are both biased here
    biased = expected_estimate(self_included, group_size)
    assert np.abs(biased - exact).max() > 0.01
    normalised = expected_estimate(
        lambda *turns: turn_loo_advantages(*turns[:1], None, *turns[1:]), group_size, lambda turns: 1.0 / turns
    )
    assert np.abs(normalised - exact).max() > 0.01


# ---- the algorithm on a packed batch -------------------------------------------------------------------------------


def episode_with(turns: list[tuple[int, float]], reward: float, group: int = 0, calls=None, sample: int = 0):
    """An episode row: a 2-token prompt, then per turn (generated tokens, turn reward) and a 1-token observation."""
    e = Episode(group=group, task_seed=0, sample=sample)
    e.extend([5, 6], mask=0)
    for n, turn_reward in turns:
        start = len(e.tokens)
        e.extend([7] * n, mask=1, logprobs=np.zeros(n))
        e.turn_spans.append((start, len(e.tokens)))
        e.turn_rewards.append(turn_reward)
        e.turn_states.append(0)
        e.extend([8], mask=0)
    e.turn_calls = list(calls or [])
    e.reward, e.turns = reward, len(turns)
    return e


def test_the_algorithm_puts_each_turns_advantage_on_its_tokens_with_the_outcome_on_the_last_call():
    # Episode A: a gateway episode in two samples, calls 0 and 2 in the first row, call 1 in the second; turn rewards
    # 0.5 (call 0), 0 (call 1), 0.25 (call 2) and an outcome of 1 beyond them (reward 1.75), which goes on call 2.
    # Returns by call: 1.75, 1.25, 1.25. Episode B: one row, 2 turns paying [0, 1] (returns 1, 1).
    a_first = episode_with([(2, 0.5), (1, 0.25)], 1.75, calls=[0, 2])
    a_second = episode_with([(3, 0.0)], 1.75, calls=[1], sample=1)
    b = episode_with([(1, 0.0), (2, 1.0)], 1.0)
    batch = pack([a_first, a_second, b])
    np.testing.assert_array_equal(batch["turn_call"], [0, 2, 1, 0, 1])
    first, turn_episode, turn_reward = episode_turns(batch)
    np.testing.assert_array_equal(first, [True, False, True])
    np.testing.assert_array_equal(turn_episode, [0, 0, 0, 1, 1])
    np.testing.assert_allclose(turn_reward, [0.5, 1.25, 0.0, 0.0, 1.0])

    config = from_dict({"model": {"path": "m"}, "algorithm": {"name": "turn_rloo"}})
    algorithm = algorithm_of(config)(local_sum)
    per_token = algorithm.advantages(batch, np.ones(3, bool))
    # A: call 0: 1.75 - 1 = 0.75, call 2: 1.25 - (nobody else at position 2) = 1.25, call 1: 1.25 - 1 = 0.25
    # B: position 0: 1 - 1.75 = -0.75, position 1: 1 - 1.25 = -0.25
    expected = np.zeros(len(batch["tokens"]), np.float32)
    for (start, end), value in zip(
        zip(batch["turn_start"], batch["turn_end"], strict=True), [0.75, 1.25, 0.25, -0.75, -0.25], strict=True
    ):
        expected[start:end] = value
    np.testing.assert_allclose(per_token, expected, atol=1e-6)
    assert (per_token[batch["loss_mask"] == 0] == 0).all()


def test_pack_numbers_an_env_episodes_turns_and_refuses_a_wrong_count_of_calls():
    batch = pack([episode_with([(1, 0.0), (1, 0.0), (1, 1.0)], 1.0)])
    np.testing.assert_array_equal(batch["turn_call"], [0, 1, 2])
    with pytest.raises(ValueError, match="3 turn spans and 2 turn_calls"):
        pack([episode_with([(1, 0.0), (1, 0.0), (1, 1.0)], 1.0, calls=[0, 1])])
