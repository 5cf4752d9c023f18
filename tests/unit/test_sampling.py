"""The top-k candidate draw gives exactly the tokens of the draw over the whole filtered vocabulary."""

from dataclasses import replace

import pytest
import torch

from agentrl.engine import sampling
from agentrl.engine.base import SamplingParams
from agentrl.engine.sampling import (
    RowSampling,
    draw_from_unnormalised,
    filter_top_k_top_p,
    sample_tokens,
    top_k_candidates,
)


def whole_vocabulary(logits: torch.Tensor, rows: RowSampling, generator: torch.Generator):
    logprobs = torch.log_softmax(logits / rows.temperature, dim=-1)
    tokens = draw_from_unnormalised(filter_top_k_top_p(logprobs.exp(), rows), rows, generator)
    tokens = torch.where(rows.greedy, logprobs.argmax(dim=-1), tokens)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def settings(params, vocab):
    return RowSampling(params, vocab, torch.device("cpu"))


@pytest.mark.parametrize("vocab", [9, 300, 5000])
@pytest.mark.parametrize("tied", [False, True])
def test_same_tokens_and_logprobs_as_the_whole_vocabulary_draw(vocab, tied, monkeypatch):
    monkeypatch.setattr(sampling, "LARGE_VOCAB", 0)  # small vocabularies draw among candidates too
    generator = torch.Generator().manual_seed(vocab)
    for trial in range(20):
        rows = 16
        top_ks = torch.randint(1, vocab, (rows,), generator=generator).tolist()
        params = [
            SamplingParams(
                4,
                temperature=[0.0, 0.6, 1.0, 1.3][(row + trial) % 4],
                top_k=min(top_k, 60),
                seed=row if row % 3 == 0 else None,
            )
            for row, top_k in enumerate(top_ks)
        ]
        if tied:  # few distinct values: many tokens share the k-th probability
            logits = torch.randint(0, 3, (rows, vocab), generator=generator).float()
        else:
            logits = torch.randn(rows, vocab, generator=generator) * (trial % 4 + 0.5)
        expected = whole_vocabulary(logits, settings(params, vocab), torch.Generator().manual_seed(trial))
        got = sample_tokens(logits, settings(params, vocab), torch.Generator().manual_seed(trial))
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_candidates_are_the_top_k_in_token_order_and_ties_fall_back():
    probs = torch.tensor([[0.1, 0.4, 0.05, 0.3, 0.15], [0.3, 0.1, 0.3, 0.3, 0.0]])
    rows = settings([SamplingParams(1, top_k=3), SamplingParams(1, top_k=2)], 5)
    assert rows.every_row_top_k
    kept_probs, kept_tokens = top_k_candidates(probs, rows)  # row 2's three tied tokens fit in 3 candidates
    assert kept_tokens[1].tolist() == [0, 2, 3]
    torch.testing.assert_close(kept_probs[1], torch.tensor([0.3, 0.3, 0.3]))
    tied = torch.tensor([[0.1, 0.4, 0.05, 0.3, 0.15], [0.25, 0.25, 0.25, 0.25, 0.0]])
    assert top_k_candidates(tied, rows) is None  # four tie for row 2's 2nd place: more than 3 candidates
    kept_probs, kept_tokens = top_k_candidates(probs[:1], settings([SamplingParams(1, top_k=3)], 5))
    assert kept_tokens.tolist() == [[1, 3, 4]]
    torch.testing.assert_close(kept_probs, torch.tensor([[0.4, 0.3, 0.15]]))


def test_a_row_with_no_top_k_or_with_a_top_p_draws_over_the_whole_vocabulary():
    assert not settings([SamplingParams(1, top_k=3), SamplingParams(1, top_k=0)], 5).every_row_top_k
    assert not settings([SamplingParams(1, top_k=3, top_p=0.9)], 5).every_row_top_k
    assert not settings([SamplingParams(1, top_k=5)], 5).every_row_top_k  # k = vocab filters nothing


def test_a_smaller_k_zeroes_the_candidates_past_it():
    probs = torch.tensor([[0.1, 0.4, 0.05, 0.3, 0.15], [0.1, 0.4, 0.05, 0.3, 0.15]])
    rows = settings([SamplingParams(1, top_k=3), SamplingParams(1, top_k=1)], 5)
    kept_probs, kept_tokens = top_k_candidates(probs, rows)
    assert kept_tokens.tolist() == [[1, 3, 4], [1, 3, 4]]
    torch.testing.assert_close(kept_probs, torch.tensor([[0.4, 0.3, 0.15], [0.4, 0.0, 0.0]]))


def test_small_vocabularies_draw_over_the_whole_vocabulary(monkeypatch):
    called = []
    monkeypatch.setattr(sampling, "top_k_candidates", lambda *args: called.append(args))
    params = [SamplingParams(1, top_k=3)] * 2
    sample_tokens(torch.randn(2, sampling.LARGE_VOCAB - 1), settings(params, sampling.LARGE_VOCAB - 1), None)
    assert not called
    sample_tokens(torch.randn(2, sampling.LARGE_VOCAB), settings(params, sampling.LARGE_VOCAB), None)
    assert called


def test_large_vocabularies_reuse_their_buffers_across_steps_and_row_changes():
    vocab = sampling.LARGE_VOCAB
    generator = torch.Generator().manual_seed(3)
    params = [SamplingParams(1, top_k=[0, 40][row % 2], temperature=0.9) for row in range(6)]
    rows, reference_rows = settings(params, vocab), settings(params, vocab)
    pointers = set()
    for step in range(4):
        if step == 2:  # rows leave, as in the running batch
            keep = torch.tensor([0, 2, 3])
            rows.select(keep)
            reference_rows.select(keep)
        logits = torch.randn(len(rows.params), vocab, generator=generator)
        got = sample_tokens(logits, rows, torch.Generator().manual_seed(step))
        expected = whole_vocabulary(logits, reference_rows, torch.Generator().manual_seed(step))
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        pointers.add(rows.scratch((len(rows.params), vocab), torch.float64).data_ptr())
    assert len(pointers) == 1


@pytest.mark.parametrize("vocab", [9, sampling.LARGE_VOCAB])
@pytest.mark.parametrize(
    "params",
    [SamplingParams(1), SamplingParams(1, top_k=5), SamplingParams(1, top_p=0.9), SamplingParams(1, temperature=0.0)],
    ids=["plain", "top_k", "top_p", "greedy"],
)
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_logits_that_are_not_finite_are_a_clear_error_not_an_index_error(vocab, params, poison):
    logits = torch.randn(3, vocab)
    logits[1, 2] = poison  # one row of a batch, as from weights gone NaN
    with pytest.raises(sampling.NonFiniteLogits, match="probabilities are not finite"):
        sample_tokens(logits, settings([SamplingParams(1), params, SamplingParams(1)], vocab), torch.Generator())
    sample_tokens(torch.randn(3, vocab), settings([params] * 3, vocab), torch.Generator())  # finite rows draw


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=2, stop_token_ids=(1, 2)),
        SamplingParams(max_new_tokens=5, temperature=0.0),
        SamplingParams(max_new_tokens=3, temperature=0.7, top_k=5, top_p=0.9, stop_token_ids=(7,)),
    ],
)
def test_rows_sharing_one_settings_object_get_the_tensors_built_row_by_row(params):
    shared = RowSampling([params] * 6, 128, torch.device("cpu"))  # one object: filled at once
    copies = RowSampling([replace(params) for _ in range(6)], 128, torch.device("cpu"))  # equal objects: row by row
    for name in (*RowSampling.TENSORS, "stop_ids"):
        a, b = getattr(shared, name), getattr(copies, name)
        assert (a is None) == (b is None), name
        assert a is None or (a.dtype == b.dtype and torch.equal(a, b)), name
    if shared.stop_ids is not None:  # each row's stop ids its own memory, not a view of one row's
        shared.stop_ids[0, 0] = 99
        assert shared.stop_ids[1, 0] != 99
