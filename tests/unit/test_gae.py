import math

import numpy as np
import pytest
import torch

from agentrl.algorithms.ppo_math import explained_variance, gae, masked_whiten, value_loss
from tests.unit.two_ranks import run_two_ranks

NAN = float("nan")


def _textbook_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Independent: plain GAE over a list of time steps, the episode ending after the last one."""
    advantages, running = [0.0] * len(rewards), 0.0
    for k in reversed(range(len(rewards))):
        next_value = values[k + 1] if k + 1 < len(values) else 0.0
        running = rewards[k] + gamma * next_value - values[k] + gamma * lam * running
        advantages[k] = running
    return advantages


def test_gae_two_turns_by_hand():
    # turn 1 = tokens 0-1, observation tokens 2-3, turn 2 = tokens 4-5, padding 6
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.5, 100.0, 0.0, 0.0, 1.0, 0.0]])  # the 100 on an observation is ignored
    values = torch.tensor([[0.2, 0.4, NAN, NAN, 0.6, 0.8, NAN]])  # no value is read off the mask
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # time steps r = 0, 0.5, 0, 1 and V = 0.2, 0.4, 0.6, 0.8; gamma * lam = 0.72
    a4 = 1.0 + 0.9 * 0.0 - 0.8  # 0.2: the last generated token's next value is 0
    a3 = (0.0 + 0.9 * 0.8 - 0.6) + 0.72 * a4  # 0.264
    a2 = (0.5 + 0.9 * 0.6 - 0.4) + 0.72 * a3  # 0.83008: token 1 bootstraps from token 4, across the observation
    a1 = (0.0 + 0.9 * 0.4 - 0.2) + 0.72 * a2  # 0.7576576
    torch.testing.assert_close(advantages, torch.tensor([[a1, a2, 0.0, 0.0, a3, a4, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[a1 + 0.2, a2 + 0.4, 0.0, 0.0, a3 + 0.6, a4 + 0.8, 0.0]]))


def test_gae_matches_the_textbook_on_compressed_steps():
    generator = torch.Generator().manual_seed(0)
    mask = (torch.rand(5, 12, generator=generator) > 0.4).float()
    mask[3] = 0.0  # a row without generated tokens
    rewards = torch.randn(5, 12, generator=generator) * mask
    values = torch.randn(5, 12, generator=generator)
    advantages, returns = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    for row in range(5):
        steps = [t for t in range(12) if mask[row, t] > 0]
        expected = _textbook_gae(
            [float(rewards[row, t]) for t in steps], [float(values[row, t]) for t in steps], 0.95, 0.9
        )
        got = [float(advantages[row, t]) for t in steps]
        assert got == pytest.approx(expected, abs=1e-5)
        assert all(
            float(returns[row, t]) == pytest.approx(a + float(values[row, t]), abs=1e-5)
            for t, a in zip(steps, expected, strict=True)
        )
    assert (advantages[mask == 0] == 0).all() and (returns[mask == 0] == 0).all()


def test_gae_with_gamma_and_lambda_one_is_reward_to_go():
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.25, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.0, 0.3, 0.1]])
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.25, 0.0, 1.0, 1.0]]))
    torch.testing.assert_close(advantages, torch.tensor([[0.75, 0.0, 0.7, 0.9]]))


def test_gae_lambda_zero_is_one_step_td():
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.1, 0.2, 0.3]])
    advantages, _ = gae(rewards, values, mask, gamma=0.5, lam=0.0)
    # delta_t = r + 0.5 V_next - V: 0.1 - 0.1, 0.15 - 0.2, 1 - 0.3
    torch.testing.assert_close(advantages, torch.tensor([[0.0, -0.05, 0.7]]))


def test_gae_has_no_grad():
    values = torch.tensor([[0.1, 0.2]], requires_grad=True)
    advantages, returns = gae(torch.tensor([[0.0, 1.0]]), values, torch.ones(1, 2), 1.0, 1.0)
    assert not advantages.requires_grad and not returns.requires_grad


def test_value_loss_by_hand():
    values = torch.tensor([1.0, 0.0, 2.0])
    old = torch.tensor([0.5, 0.5, 2.0])
    returns = torch.tensor([2.0, 1.0, 0.0])
    loss, clipped = value_loss(values, old, returns, clip=0.2)
    # t0: clip(1, 0.3, 0.7) = 0.7: max((1-2)^2, (0.7-2)^2) = max(1, 1.69) -> 0.845, the clipped term wins
    # t1: clip(0, 0.3, 0.7) = 0.3: max(1, 0.49) = 1 -> 0.5; t2: inside: 4 -> 2
    torch.testing.assert_close(loss, torch.tensor([0.845, 0.5, 2.0]))
    torch.testing.assert_close(clipped, torch.tensor([1.0, 0.0, 0.0]))
    loss, clipped = value_loss(values, old, returns, clip=None)
    torch.testing.assert_close(loss, torch.tensor([0.5, 0.5, 2.0]))
    assert clipped.sum() == 0


def test_value_loss_gradient_stops_where_clipped():
    values = torch.tensor([1.0, 0.0], requires_grad=True)
    loss, _ = value_loss(values, torch.tensor([0.5, 0.5]), torch.tensor([2.0, 1.0]), clip=0.2)
    loss.sum().backward()
    # t0 uses the clipped value (constant in v): 0; t1: d 0.5 (v - R)^2 / dv = v - R = -1
    torch.testing.assert_close(values.grad, torch.tensor([0.0, -1.0]))


def test_masked_whiten_by_hand_and_over_two_ranks():
    values = torch.tensor([[1.0, 2.0, 3.0, 50.0], [4.0, 5.0, 6.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    out = masked_whiten(values, mask)
    # mean 2, unbiased var ((1)^2 + 0 + 1^2) / 2 = 1
    s = math.sqrt(1 + 1e-8)
    torch.testing.assert_close(out, torch.tensor([[-1 / s, 0.0, 1 / s, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    generator = torch.Generator().manual_seed(1)
    values = torch.randn(6, 5, generator=generator)
    mask = (torch.rand(6, 5, generator=generator) > 0.4).float()
    whole = masked_whiten(values, mask)
    halves = run_two_ranks(
        lambda rank, reduce: masked_whiten(values[3 * rank : 3 * rank + 3], mask[3 * rank : 3 * rank + 3], reduce)
    )
    torch.testing.assert_close(torch.cat(halves), whole)
    assert (masked_whiten(values, torch.zeros(6, 5)) == 0).all()


def test_explained_variance_by_hand():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 99.0]])
    values = torch.tensor([[1.0, 2.0, 3.0, 3.0, -99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    # residuals 0, 0, 0, 1: var = 1/4 - 1/16 = 3/16; var of returns = 30/4 - 2.5^2 = 1.25
    assert explained_variance(values, returns, mask) == pytest.approx(1 - (3 / 16) / 1.25)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 5), returns, mask) == pytest.approx(0.0, abs=1e-12)
    # undefined cases are 0.0, never nan
    assert explained_variance(values, torch.full((1, 5), 0.7), mask) == 0.0
    assert explained_variance(values, returns, torch.zeros(1, 5)) == 0.0


def test_explained_variance_over_two_ranks():
    generator = torch.Generator().manual_seed(2)
    returns = torch.randn(4, 6, generator=generator)
    values = returns + 0.5 * torch.randn(4, 6, generator=generator)
    mask = (torch.rand(4, 6, generator=generator) > 0.3).float()
    whole = explained_variance(values, returns, mask)
    halves = run_two_ranks(
        lambda rank, reduce: explained_variance(
            values[2 * rank : 2 * rank + 2], returns[2 * rank : 2 * rank + 2], mask[2 * rank : 2 * rank + 2], reduce
        )
    )
    assert halves[0] == pytest.approx(whole) and halves[1] == pytest.approx(whole)
    assert np.isfinite(whole)
