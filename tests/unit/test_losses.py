import math

import pytest
import torch

from agentrl.algorithms.losses import (
    AGGREGATION_MODES,
    aggregate_loss,
    aggregation_counts,
    cispo_loss,
    clipped_ratio_terms,
    gspo_loss,
    ppo_clip_loss,
)

# --- PPO clip ---------------------------------------------------------------------------------


def test_ppo_clip_by_hand():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.1]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 2.0, -3.0]])
    loss, clipped = ppo_clip_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    # ratio 1.5, A=1: min(1.5, 1.2) = 1.2 -> 1.2 clipped; ratio 0.5, A=-1: min(-0.5, -0.8) -> 0.8 clipped
    # ratio 1, A=2: 2 -> -2; ratio 1.1, A=-3: min(-3.3, -3.3) -> 3.3, inside the range
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 0.8, -2.0, 3.3]]))
    torch.testing.assert_close(clipped, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_ppo_clip_asymmetric_range():
    logp = torch.log(torch.tensor([1.25, 1.25]))
    loss, clipped = ppo_clip_loss(logp, torch.zeros(2), torch.tensor([1.0, 1.0]), clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([-1.25, -1.25]))  # 1.25 < 1.28: not clipped
    assert clipped.sum() == 0
    loss, clipped = ppo_clip_loss(logp, torch.zeros(2), torch.tensor([1.0, 1.0]), clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(loss, torch.tensor([-1.2, -1.2]))
    assert clipped.sum() == 2


def test_ppo_clip_terms_equal_the_policy_gradient_terms_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    logp = torch.randn(5, 9, generator=generator) * 0.3 - 1.0
    old = logp + torch.randn(5, 9, generator=generator) * 0.2
    adv = torch.randn(5, 1, generator=generator)
    mask = (torch.rand(5, 9, generator=generator) > 0.3).float()
    terms, clipped_terms = clipped_ratio_terms(logp, old, adv, 0.2, 0.28)  # PolicyGradient.token_loss's
    loss_tok, clipped_tok = ppo_clip_loss(logp, old, adv, 0.2, 0.28)
    assert torch.equal(loss_tok * mask, terms * mask)
    assert torch.equal(clipped_tok * mask, clipped_terms * mask)
    assert (clipped_terms * mask).sum() > 0  # the comparison covers clipped tokens too


def test_dual_clip_caps_negative_advantages_only():
    logp = torch.log(torch.tensor([5.0, 2.0, 5.0, 0.5]))
    adv = torch.tensor([-1.0, -1.0, 1.0, -2.0])
    loss, clipped = ppo_clip_loss(logp, torch.zeros(4), adv, 0.2, 0.2, dual_clip=3.0)
    # ratio 5, A=-1: PPO gives max(5, 1.2) = 5, dual clip caps at 3 -> 3 (clipped)
    # ratio 2, A=-1: PPO 2 < 3 -> 2 (not clipped); ratio 5, A=+1: PPO -1.2 (clipped by PPO, no dual)
    # ratio 0.5, A=-2: PPO max(1, 1.6) = 1.6 (clipped by PPO's lower bound)
    torch.testing.assert_close(loss, torch.tensor([3.0, 2.0, -1.2, 1.6]))
    torch.testing.assert_close(clipped, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    plain, _ = ppo_clip_loss(logp, torch.zeros(4), adv, 0.2, 0.2)
    torch.testing.assert_close(plain, torch.tensor([5.0, 2.0, -1.2, 1.6]))
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(logp, torch.zeros(4), adv, 0.2, 0.2, dual_clip=1.0)


def test_dual_clip_gradient_is_zero_where_capped():
    logp = torch.log(torch.tensor([5.0, 2.0])).requires_grad_()
    loss, _ = ppo_clip_loss(logp, torch.zeros(2), torch.tensor([-1.0, -1.0]), 0.2, 0.2, dual_clip=3.0)
    loss.sum().backward()
    # token 0 capped: constant; token 1: d(-r A)/dlogp = -A r = 2
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 2.0]))


# --- GSPO -------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-1.0, -1.0, -1.0, -1.0]])
    old = torch.tensor([[-1.2, -1.9, -0.8, float("-inf")], [-1.0, -1.0, -1.0, -1.0]])  # -inf: padding garbage
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0], [2.0]])
    loss, clipped = gspo_loss(logp, old, adv, mask, clip_low=0.5, clip_high=0.5)
    # row 0: log-ratios 0.2, -0.1, 0.3 over the 3 masked tokens (the unmasked one is ignored): mean 0.4/3
    s0 = math.exp(0.4 / 3)
    # row 1 has no masked token: s = 1
    expected = torch.tensor([[-s0] * 4, [-2.0] * 4])
    torch.testing.assert_close(loss, expected)
    assert clipped.sum() == 0


def test_gspo_clips_whole_sequences():
    logp = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    old = torch.tensor([[-0.1, -0.1], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    loss, clipped = gspo_loss(logp, old, torch.tensor([[1.0], [1.0]]), mask, clip_low=3e-4, clip_high=4e-4)
    # row 0: s = exp(0.1) = 1.105 > 1 + 4e-4 -> clipped to 1.0004 at both tokens; row 1: s = 1
    torch.testing.assert_close(loss, torch.tensor([[-1.0004, -1.0004], [-1.0, -1.0]]))
    torch.testing.assert_close(clipped, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_gspo_tokens_share_one_ratio_but_own_their_gradient():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.9, -0.8]])
    mask = torch.ones(1, 3)
    loss, _ = gspo_loss(logp, old, torch.tensor([[1.0]]), mask, 10.0, 10.0)
    s = math.exp((0.2 - 0.1 + 0.3) / 3)
    loss[0, 1].backward()
    # token 1's loss -s * A depends on token 1's log-prob only (the sequence ratio is detached), slope -s A
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -s, 0.0]]))


def test_gspo_with_seq_mean_token_mean_matches_the_papers_sequence_objective():
    generator = torch.Generator().manual_seed(1)
    logp0 = torch.randn(3, 5, generator=generator) * 0.1 - 1.0
    old = logp0 + torch.randn(3, 5, generator=generator) * 0.05
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]])
    adv = torch.tensor([[1.5], [-0.7], [0.4]])

    logp = logp0.clone().requires_grad_()
    loss_tok, _ = gspo_loss(logp, old, adv, mask, 0.2, 0.2)
    aggregate_loss(loss_tok, mask, "seq-mean-token-mean", *aggregation_counts(mask)).backward()

    # independent: the paper's J = 1/G sum_i min(s_i A_i, clip(s_i) A_i), s_i with its full gradient
    reference = logp0.clone().requires_grad_()
    rows = []
    for i in range(3):
        m = mask[i] > 0
        s_i = torch.exp((reference[i][m] - old[i][m]).mean())
        a_i = adv[i, 0]
        rows.append(-torch.minimum(s_i * a_i, torch.clamp(s_i, 0.8, 1.2) * a_i))
    (sum(rows) / 3).backward()
    torch.testing.assert_close(logp.grad, reference.grad)
    assert logp.grad[mask == 0].abs().sum() == 0


# --- CISPO ------------------------------------------------------------------------------------


def test_cispo_by_hand_and_gradient():
    logp = torch.log(torch.tensor([[2.0, 0.5, 1.1, 0.1]])).requires_grad_()
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -2.0, 3.0, 1.0]])
    loss, clipped = cispo_loss(logp, old, adv, clip_low=None, clip_high=0.28)
    # weights: min(2, 1.28) = 1.28; 0.5 (no lower bound); 1.1; 0.1 (no lower bound)
    weights = torch.tensor([[1.28, 0.5, 1.1, 0.1]])
    logs = [math.log(2.0), math.log(0.5), math.log(1.1), math.log(0.1)]
    expected = [-1.28 * 1.0 * logs[0], -0.5 * -2.0 * logs[1], -1.1 * 3.0 * logs[2], -0.1 * 1.0 * logs[3]]
    torch.testing.assert_close(loss, torch.tensor([expected]))
    torch.testing.assert_close(clipped, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    loss.sum().backward()
    # the weight is detached: d loss / d logp = -w A, even where the ratio was clipped (no token is switched off)
    torch.testing.assert_close(logp.grad, -weights * adv)


def test_cispo_lower_bound_when_given():
    logp = torch.log(torch.tensor([0.5, 0.9]))
    loss, clipped = cispo_loss(logp, torch.zeros(2), torch.ones(2), clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(loss, torch.tensor([-0.8 * math.log(0.5), -0.9 * math.log(0.9)]))
    torch.testing.assert_close(clipped, torch.tensor([1.0, 0.0]))


# --- aggregation ------------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 0.5, 7.0, 7.0], [5.0, 5.0, 5.0, 5.0], [-2.0, 6.0, 1.0, 1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
# masked row sums: 6, 0.5, 0 (no token), 4; token counts 3, 1, 0, 2 -> 6 tokens, 3 sequences


def test_aggregation_modes_by_hand():
    assert aggregation_counts(MASK) == (6.0, 3.0)
    assert aggregate_loss(LOSS, MASK, "token-mean", 6.0, 3.0).item() == pytest.approx((6 + 0.5 + 4) / 6)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", 6.0, 3.0).item() == pytest.approx((6 + 0.5 + 4) / 3)
    mean_of_means = (6 / 3 + 0.5 / 1 + 4 / 2) / 3
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean", 6.0, 3.0).item() == pytest.approx(mean_of_means)
    normed = aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", 6.0, 3.0, norm_length=8)
    assert normed.item() == pytest.approx((6 + 0.5 + 4) / (3 * 8))


def test_token_mean_is_todays_trainer_loss_bit_for_bit():
    generator = torch.Generator().manual_seed(2)
    loss = torch.randn(4, 7, generator=generator)
    mask = (torch.rand(4, 7, generator=generator) > 0.4).float()
    global_tokens = 37.0
    assert torch.equal(aggregate_loss(loss, mask, "token-mean", global_tokens), (loss * mask).sum() / global_tokens)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batches_and_ranks_sum_to_the_global_loss(mode):
    generator = torch.Generator().manual_seed(3)
    loss = torch.randn(8, 6, generator=generator)
    mask = (torch.rand(8, 6, generator=generator) > 0.5).float()
    mask[5] = 0.0  # an episode with no trained token
    tokens, sequences = aggregation_counts(mask)
    whole = aggregate_loss(loss, mask, mode, tokens, sequences, norm_length=6)
    # two ranks with two micro-batches each, of different sizes; counts summed over all of them
    parts = [slice(0, 1), slice(1, 4), slice(4, 7), slice(7, 8)]
    counts = [aggregation_counts(mask[p]) for p in parts]
    global_tokens, global_sequences = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert (global_tokens, global_sequences) == (tokens, sequences)
    total = sum(aggregate_loss(loss[p], mask[p], mode, global_tokens, global_sequences, 6) for p in parts)
    torch.testing.assert_close(total, whole)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregation_without_trained_tokens_is_zero(mode):
    out = aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode, 0.0, 0.0, norm_length=3)
    assert out.item() == 0.0


def test_aggregation_gradient_weights():
    loss = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    aggregate_loss(loss, mask, "seq-mean-token-mean", 4.0, 2.0).backward()
    # each sequence weighs 1/2, spread over its own tokens: 1/6 per token of row 0, 1/2 for row 1's token
    torch.testing.assert_close(loss.grad, torch.tensor([[1 / 6, 1 / 6, 1 / 6], [0.5, 0.0, 0.0]]))


def test_aggregation_errors_name_the_fix():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(LOSS, MASK, "sum", 6.0, 3.0)
    with pytest.raises(ValueError, match="global_sequences"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum", 6.0)
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", 6.0, 3.0)
