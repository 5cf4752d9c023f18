import math

import numpy as np
import torch

from agentrl.algorithms.advantages import group_advantages
from agentrl.algorithms.losses import entropy, kl_k3, ppo_clip_loss, token_logprobs
from agentrl.trainer.optim import lr_lambda


def test_group_advantages_are_relative_within_groups():
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 5.0, 5.0])
    groups = np.array([0, 0, 0, 0, 1, 1])
    adv = group_advantages(rewards, groups, std_norm=False)
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25, 0.0, 0.0], atol=1e-6)
    normed = group_advantages(rewards, groups, std_norm=True)
    np.testing.assert_allclose(normed[:4] * np.std([1, 0, 0, 0]), adv[:4], atol=1e-5)


def test_invalid_episodes_get_zero_and_are_excluded():
    rewards = np.array([1.0, 0.0, 100.0])
    adv = group_advantages(rewards, np.zeros(3), valid=np.array([True, True, False]), std_norm=False)
    np.testing.assert_allclose(adv, [0.5, -0.5, 0.0])


def test_token_logprobs_respect_temperature():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    targets = torch.tensor([0])
    expected = torch.log_softmax(logits / 0.5, -1)[0, 0]
    assert torch.isclose(token_logprobs(logits, targets, 0.5)[0], expected)


def test_clipped_loss_matches_hand_computation():
    logp = torch.log(torch.tensor([1.5, 0.5, 1.0]))
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 2.0])
    mask = torch.tensor([1.0, 1.0, 0.0])
    loss_tok, clipped_tok = ppo_clip_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    loss, clipped = (loss_tok * mask).sum(), (clipped_tok * mask).sum()
    # token 0: ratio 1.5 clipped to 1.2 -> -1.2; token 1: ratio 0.5 clipped to 0.8 -> min(-0.5, -0.8) = -0.8 -> +0.8
    assert math.isclose(loss.item(), -1.2 + 0.8, rel_tol=1e-6)
    assert clipped.item() == 2.0


def test_unclipped_gradient_is_policy_gradient():
    logp = torch.zeros(2, requires_grad=True)
    loss, _ = ppo_clip_loss(logp, torch.zeros(2), torch.tensor([1.0, -2.0]), 0.2, 0.2)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-1.0, 2.0]))


def test_kl_k3_is_zero_at_equality_and_positive_otherwise():
    assert kl_k3(torch.tensor(0.3), torch.tensor(0.3)).item() == 0.0
    assert kl_k3(torch.tensor(-0.1), torch.tensor(-2.0)).item() > 0.0


def test_entropy_of_uniform():
    assert math.isclose(entropy(torch.zeros(1, 8))[0].item(), math.log(8), rel_tol=1e-6)


def test_lr_schedules():
    warm = lr_lambda("constant", warmup=4, total=10, min_ratio=0.1)
    assert [warm(s) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    cosine = lr_lambda("cosine", warmup=0, total=10, min_ratio=0.1)
    assert cosine(0) == 1.0 and math.isclose(cosine(10), 0.1)
    linear = lr_lambda("linear", warmup=0, total=10, min_ratio=0.0)
    assert math.isclose(linear(5), 0.5)
