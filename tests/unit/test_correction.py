import math

import pytest
import torch

from agentrl.algorithms.correction import CORRECTION_MODES, mismatch_kl, rollout_correction

# rows: ratios pi_old/mu of 2, 0.5, 1 at three masked tokens and 3 at an unmasked one;
# 1.1, 1.2 at two masked tokens; a row without masked tokens
RATIOS = torch.tensor([[2.0, 0.5, 1.0, 3.0], [1.1, 1.2, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
ROLLOUT = torch.full((3, 4), -1.3)
OLD = ROLLOUT + torch.log(RATIOS)


def test_none_is_neutral_but_measures():
    weights, keep, stats = rollout_correction(OLD, ROLLOUT, MASK, "none")
    assert torch.equal(weights, torch.ones(3, 4)) and torch.equal(keep, torch.ones(3, 4))
    assert stats["tokens"] == 5 and stats["sequences"] == 2
    assert stats["masked_tokens"] == 0 and stats["masked_sequences"] == 0 and stats["capped_tokens"] == 0
    assert stats["is_weight_sum"] == 5.0
    expected_log = math.log(2) + math.log(0.5) + math.log(1) + math.log(1.1) + math.log(1.2)
    assert stats["log_ratio_sum"] == pytest.approx(expected_log, abs=1e-6)


def test_token_tis_by_hand():
    weights, keep, stats = rollout_correction(OLD, ROLLOUT, MASK, "tis", "token", cap=1.5)
    # min(2, 1.5), 0.5 (no lower truncation), 1; the unmasked 3 stays neutral; 1.1, 1.2
    expected = torch.tensor([[1.5, 0.5, 1.0, 1.0], [1.1, 1.2, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(weights, expected)
    assert torch.equal(keep, torch.ones(3, 4))
    assert stats["capped_tokens"] == 1
    assert stats["is_weight_sum"] == pytest.approx(1.5 + 0.5 + 1.0 + 1.1 + 1.2, abs=1e-5)


def test_sequence_tis_uses_the_geometric_mean():
    weights, _, stats = rollout_correction(OLD, ROLLOUT, MASK, "tis", "sequence", cap=1.5)
    # row 0: (2 * 0.5 * 1)^(1/3) = 1 (the unmasked 3 is ignored); row 1: sqrt(1.1 * 1.2) = 1.1489
    row1 = math.sqrt(1.1 * 1.2)
    expected = torch.tensor([[1.0, 1.0, 1.0, 1.0], [row1, row1, 1.0, 1.0], [1.0] * 4])
    torch.testing.assert_close(weights, expected)
    weights, _, stats = rollout_correction(OLD, ROLLOUT, MASK, "tis", "sequence", cap=1.1)
    torch.testing.assert_close(weights[1], torch.tensor([1.1, 1.1, 1.0, 1.0]))
    assert stats["capped_tokens"] == 2


def test_token_mask_by_hand():
    weights, keep, stats = rollout_correction(OLD, ROLLOUT, MASK, "mask", "token", low=0.6, high=2.0)
    # 2 is inside (bounds inclusive), 0.5 < 0.6 is rejected; the unmasked 3 is not judged
    expected = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0] * 4])
    torch.testing.assert_close(keep, expected)
    assert torch.equal(weights, torch.ones(3, 4))  # rejection alone: no IS weight on the kept tokens
    assert stats["masked_tokens"] == 1 and stats["masked_sequences"] == 1
    assert stats["is_weight_sum"] == 4.0  # four kept tokens of weight 1


def test_sequence_mask_rejects_whole_rows():
    ratios = torch.tensor([[2.0, 2.0, 2.0], [1.0, 1.3, 0.9]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    rollout = torch.zeros(2, 3)
    _, keep, stats = rollout_correction(torch.log(ratios), rollout, mask, "mask", "sequence", low=0.5, high=1.5)
    # row 0: geometric mean 2 > 1.5 -> its masked tokens dropped (the unmasked stays 1)
    # row 1: (1 * 1.3 * 0.9)^(1/3) = 1.054 -> kept
    torch.testing.assert_close(keep, torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]))
    assert stats["masked_tokens"] == 2 and stats["masked_sequences"] == 1 and stats["sequences"] == 2


def test_tis_mask_combines_weights_and_rejection():
    weights, keep, stats = rollout_correction(OLD, ROLLOUT, MASK, "tis_mask", "token", cap=1.15, low=0.6, high=2.0)
    torch.testing.assert_close(keep[0], torch.tensor([1.0, 0.0, 1.0, 1.0]))
    torch.testing.assert_close(weights[0, [0, 2]], torch.tensor([1.15, 1.0]))
    torch.testing.assert_close(weights[1, :2], torch.tensor([1.1, 1.15]))
    # kept tokens: 2 -> 1.15 (capped), 1, 1.1, 1.2 -> 1.15 (capped); the rejected 0.5 is not counted
    assert stats["capped_tokens"] == 2
    assert stats["is_weight_sum"] == pytest.approx(1.15 + 1.0 + 1.1 + 1.15, abs=1e-5)


def test_weights_are_detached_and_ignore_garbage_outside_the_mask():
    old = OLD.clone().requires_grad_()
    rollout = ROLLOUT.clone()
    rollout[0, 3] = float("-inf")  # padding garbage where mask is 0
    weights, keep, stats = rollout_correction(old, rollout, MASK, "tis_mask", "sequence", cap=2.0, low=0.5, high=2.0)
    assert not weights.requires_grad and not keep.requires_grad
    assert torch.isfinite(weights).all() and math.isfinite(stats["log_ratio_sum"])


@pytest.mark.parametrize("mode", CORRECTION_MODES)
def test_stats_are_sums_over_rows(mode):
    generator = torch.Generator().manual_seed(0)
    old = torch.randn(6, 5, generator=generator) * 0.3 - 1
    rollout = old + torch.randn(6, 5, generator=generator) * 0.5
    mask = (torch.rand(6, 5, generator=generator) > 0.3).float()
    for level in ("token", "sequence"):
        args = (mode, level, 1.5, 0.7, 1.4)
        whole = rollout_correction(old, rollout, mask, *args)
        top = rollout_correction(old[:2], rollout[:2], mask[:2], *args)
        bottom = rollout_correction(old[2:], rollout[2:], mask[2:], *args)
        torch.testing.assert_close(torch.cat([top[0], bottom[0]]), whole[0])
        torch.testing.assert_close(torch.cat([top[1], bottom[1]]), whole[1])
        assert whole[2].keys() == top[2].keys()
        for key in whole[2]:
            assert top[2][key] + bottom[2][key] == pytest.approx(whole[2][key])


def test_correction_errors_name_the_fix():
    with pytest.raises(ValueError, match="tis"):
        rollout_correction(OLD, ROLLOUT, MASK, "is")
    with pytest.raises(ValueError, match="cap"):
        rollout_correction(OLD, ROLLOUT, MASK, "tis")
    with pytest.raises(ValueError, match="low"):
        rollout_correction(OLD, ROLLOUT, MASK, "mask", low=2.0, high=0.5)
    with pytest.raises(ValueError, match="sequence"):
        rollout_correction(OLD, ROLLOUT, MASK, "none", level="episode")


def test_mismatch_kl_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -7.0]])
    rollout = torch.tensor([[-1.5, -1.8, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    k1, k3 = mismatch_kl(trainer, rollout, mask)
    # d = log pi - log mu = 0.5, -0.2; k1 = -(0.5 - 0.2) = -0.3
    assert k1 == pytest.approx(-0.3)
    assert k3 == pytest.approx((math.exp(0.5) - 0.5 - 1) + (math.exp(-0.2) + 0.2 - 1))
    assert isinstance(k1, float) and isinstance(k3, float)
    assert mismatch_kl(trainer, trainer, mask) == (0.0, 0.0)
    assert mismatch_kl(trainer, rollout, torch.zeros(1, 3)) == (0.0, 0.0)
