"""agentrl.engine.lean_decoder: prefill and decode steps that match the forward up to float rounding, or none."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from agentrl.engine.continuous import ContinuousTorchEngine
from agentrl.engine.hf import cache_keyword
from agentrl.engine.lean_decoder import Feed, LeanDecoder, append_columns, rotation_sin
from agentrl.engine.running_batch import RowsLeaving, append_rows, keep_rows

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
FAMILIES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"num_key_value_heads": 4}),
    "qwen2 grouped-query": (Qwen2Config, Qwen2ForCausalLM, {"num_key_value_heads": 2}),
    "llama": (LlamaConfig, LlamaForCausalLM, {"num_key_value_heads": 4}),
    "qwen3 (q/k norms)": (Qwen3Config, Qwen3ForCausalLM, {"num_key_value_heads": 2, "head_dim": 16}),
}


def build(family: str, attention: str = "sdpa"):
    config_class, model_class, extra = FAMILIES[family]
    config = config_class(**SIZES, **extra)
    config._attn_implementation = attention
    torch.manual_seed(0)
    return model_class(config).eval()


ROUNDING = 1e-5  # float32 rounding: the lean ops add and multiply in another order than the forward's


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=ROUNDING, atol=ROUNDING)


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_ragged_prefills_and_many_decode_steps_match_the_forward(family):
    model = build(family)
    decoder = LeanDecoder.for_model(model)
    assert decoder is not None
    keyword = cache_keyword(model)
    # three rows, left-padded to different lengths, with a hole (a masked column) in the middle row
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 11, 0, 13, 14], [0, 0, 0, 21, 22]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 0, 1, 1], [0, 0, 0, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    forward_cache, lean_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
    expected = model(input_ids=ids, attention_mask=mask, position_ids=positions, **{keyword: forward_cache})
    assert_close(decoder.prefill(ids, mask, positions, lean_cache), expected.logits[:, -1, :])
    # a later turn: new tokens of different counts after the kept columns, prefilled together
    more = torch.tensor([[40, 41, 42], [0, 0, 43], [0, 44, 45]])
    more_mask = torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]])
    mask = torch.cat([mask, more_mask], dim=1)
    more_positions = positions[:, -1:] + (more_mask.cumsum(-1)).clamp(min=1)
    expected = model(input_ids=more, attention_mask=mask, position_ids=more_positions, **{keyword: forward_cache})
    assert_close(decoder.prefill(more, mask, more_positions, lean_cache), expected.logits[:, -1, :])

    next_positions = more_positions[:, -1] + 1
    tokens = torch.tensor([30, 31, 32])
    for _ in range(12):
        mask = torch.cat([mask, torch.ones((3, 1), dtype=mask.dtype)], dim=1)
        expected = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=next_positions[:, None],
            **{keyword: forward_cache},
        ).logits[:, -1, :]
        got = decoder.decode(tokens, mask.bool(), next_positions, lean_cache)
        assert_close(got, expected)
        tokens, next_positions = expected.argmax(-1), next_positions + 1
    visible = mask.bool()[:, None, :, None]  # padding columns hold whatever padding computed; nothing reads them
    for forward_layer, lean_layer in zip(forward_cache.layers, lean_cache.layers, strict=True):
        assert_close(lean_layer.keys * visible, forward_layer.keys * visible)
        assert_close(lean_layer.values * visible, forward_layer.values * visible)


@torch.inference_mode()
def test_padding_of_a_ragged_prefill_skips_the_projections(monkeypatch):
    """Only the real tokens go through the matrix products; the logits are the forward's all the same
    (the tests above run the same ragged prefills against it)."""
    model = build("qwen2")
    decoder = LeanDecoder.for_model(model)
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13], [0, 0, 0, 21, 22]])
    mask = (ids != 0).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    rows_seen = []
    linear = F.linear

    def counting(x, weight, bias=None):
        rows_seen.append(x.shape[0])
        return linear(x, weight, bias)

    monkeypatch.setattr(F, "linear", counting)
    expected = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1, :]
    rows_seen.clear()
    assert_close(decoder.prefill(ids, mask, positions, DynamicCache(config=model.config)), expected)
    assert rows_seen[:2] == [10, 10], "q/k/v and gate/up of the first layer: the 10 real tokens of 15"
    assert rows_seen[-1] == 3, "the head: each row's last token"
    rows_seen.clear()
    full = torch.ones_like(mask)
    decoder.prefill(ids, full, (full.cumsum(-1) - 1), DynamicCache(config=model.config))
    assert rows_seen[:2] == [15, 15], "no padding: every token"


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_a_decode_step_and_a_prefill_in_one_pass_match_them_apart(family):
    model = build(family)
    decoder = LeanDecoder.for_model(model)
    keyword = cache_keyword(model)
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 11, 12]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    running, forward_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
    decoder.prefill(ids, mask, positions, running)
    model(input_ids=ids, attention_mask=mask, position_ids=positions, **{keyword: forward_cache})
    tokens, step_mask, step_positions = torch.tensor([30, 31]), F.pad(mask, (0, 1), value=1), positions[:, -1] + 1
    # three admitted rows of other widths, one after a kept past
    admitted_ids = torch.tensor([[0, 0, 40], [41, 42, 43], [0, 44, 45]])
    admitted_mask = torch.tensor([[0, 1, 0, 0, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]])
    admitted_positions = torch.tensor([[0, 0, 1], [0, 1, 2], [0, 0, 1]])
    past = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([[0, 50]]).expand(3, 2), attention_mask=admitted_mask[:, :2], **{keyword: past})
    admitted_cache = DynamicCache(config=model.config)
    for layer, kept in zip(admitted_cache.layers, past.layers, strict=True):
        layer.lazy_initialization(kept.keys, kept.values)
        layer.keys, layer.values = kept.keys.clone(), kept.values.clone()
    expected_admitted = model(
        input_ids=admitted_ids, attention_mask=admitted_mask, position_ids=admitted_positions, **{keyword: past}
    ).logits[:, -1]
    expected_step = model(
        input_ids=tokens[:, None],
        attention_mask=step_mask,
        position_ids=step_positions[:, None],
        **{keyword: forward_cache},
    ).logits[:, -1]

    step, admitted = decoder.forward(
        [
            Feed.decode(tokens, step_mask.bool(), step_positions, running),
            Feed.prefill(admitted_ids, admitted_mask, admitted_positions, admitted_cache),
        ]
    )
    assert step.shape == (2, model.config.vocab_size) and admitted.shape == (3, model.config.vocab_size)
    assert_close(step, expected_step)
    assert_close(admitted, expected_admitted)
    assert running.layers[0].keys.shape[2] == 5 and admitted_cache.layers[0].keys.shape[2] == 5


@torch.inference_mode()
def test_rotary_positions_are_the_models_own_far_past_the_first_table():
    model = build("qwen2")
    decoder = LeanDecoder.for_model(model)
    hidden = torch.zeros(1, 3, SIZES["hidden_size"])
    for positions in (torch.tensor([0, 5, 9]), torch.tensor([3, 700, 1500])):  # the second grows the table
        cos, sin = model.model.rotary_emb(hidden, positions[None])
        got_cos, got_signed_sin = decoder.rotary(hidden, positions)
        assert torch.equal(got_cos[:, 0], cos[0]) and torch.equal(got_signed_sin[:, 0], rotation_sin(sin)[0])
    assert decoder.rotary.cos.shape[0] > 1500


@torch.inference_mode()
def test_weights_copied_into_the_model_reach_the_fused_projections():
    model = build("qwen2 grouped-query")
    decoder = LeanDecoder.for_model(model)
    tokens, mask, positions = torch.tensor([[3, 4, 5]]), torch.ones((1, 3), dtype=torch.long), torch.arange(3)[None]
    before = decoder.prefill(tokens, mask, positions, DynamicCache(config=model.config))
    with torch.no_grad():  # as the engines load weights: copied into the parameters in place
        for name, param in model.named_parameters():
            if name.endswith(("k_proj.weight", "up_proj.weight")):
                param.copy_(torch.randn_like(param))
    assert decoder.matches_forward()
    after = decoder.prefill(tokens, mask, positions, DynamicCache(config=model.config))
    assert not torch.allclose(before, after)

    attention = model.model.layers[0].self_attn  # a parameter replaced, not copied into: fused again
    attention.v_proj.weight = torch.nn.Parameter(torch.randn_like(attention.v_proj.weight))
    assert decoder.matches_forward()


def test_models_it_does_not_cover_keep_the_forward():
    assert LeanDecoder.for_model(build("qwen2", attention="eager")) is None  # the forward's eager path is not checked

    broken = build("qwen2")  # a layer that does more than the family's layer: the forward and the decoder differ
    layer_forward = broken.model.layers[0].forward
    broken.model.layers[0].forward = lambda *args, **kwargs: 1.5 * layer_forward(*args, **kwargs)
    assert LeanDecoder(broken).matches_forward() is False
    assert LeanDecoder.for_model(broken) is None


def test_the_continuous_engine_decodes_with_it_where_it_applies():
    assert ContinuousTorchEngine(build("qwen2"), pad_token_id=0).decoder is not None
    assert ContinuousTorchEngine(build("qwen2", attention="eager"), pad_token_id=0).decoder is None


def test_kept_keys_grow_in_place_while_their_buffer_has_room():
    kept = torch.randn(3, 2, 5, 4)
    new = torch.randn(3, 2, 1, 4)
    grown = append_columns(kept, new)  # a plain tensor has no room: copied once into a buffer with room
    assert torch.equal(grown, torch.cat([kept, new], dim=2))
    again = append_columns(grown, 2 * new)
    assert again.data_ptr() == grown.data_ptr()  # written in place, one column
    assert torch.equal(again, torch.cat([kept, new, 2 * new], dim=2))

    leaving = RowsLeaving([False, True, False])  # row 1 leaves; row 2 takes its place, and only it moves
    assert leaving.order == [0, 2]
    trimmed = keep_rows(again[:, :, 2:], leaving)  # and columns only the departed row used go
    assert torch.equal(trimmed, torch.cat([kept, new, 2 * new], dim=2)[[0, 2], :, 2:])
    grown_again = append_columns(trimmed, new[:2])
    assert grown_again.data_ptr() == trimmed.data_ptr()
    assert torch.equal(grown_again[:, :, -1:], new[:2])

    two = append_columns(grown_again, torch.ones(2, 2, 2, 4))  # several columns at once (a prefill)
    assert two.data_ptr() == trimmed.data_ptr() and torch.equal(two[:, :, -2:], torch.ones(2, 2, 2, 4))
    assert torch.equal(append_columns(None, new), new)


def test_rows_joining_are_written_into_spare_rows_and_only_a_wider_row_copies_the_cache():
    kept = append_columns(None, torch.randn(2, 2, 4, 3))  # a buffer with room for columns, none for rows
    joined = append_rows(kept, torch.ones(1, 2, 3, 3), width=4)  # no spare rows: copied once, with spare rows
    assert joined.shape == (3, 2, 4, 3)
    assert torch.equal(joined[:2], kept) and torch.equal(joined[2, :, 1:], torch.ones(2, 3, 3))
    assert not joined[2, :, :1].any()  # zeros on the left of a shorter row

    again = append_rows(joined, torch.full((2, 2, 4, 3), 2.0), width=4)  # into the spare rows, in place
    assert again.data_ptr() == joined.data_ptr() and again.shape == (5, 2, 4, 3)
    assert torch.equal(again[:3], joined) and (again[3:] == 2).all()
    assert append_columns(again, torch.zeros(5, 2, 1, 3)).data_ptr() == again.data_ptr()  # room for columns too

    left = keep_rows(again, RowsLeaving([False, True, True, False, False]))  # two leave; a third row moves up
    assert left.shape[0] == 3
    back = append_rows(left, torch.full((2, 2, 2, 3), 3.0), width=4)  # into the rows that left
    assert back.data_ptr() == left.data_ptr() and (back[3:, :, 2:] == 3).all() and not back[3:, :, :2].any()

    wider = append_rows(back, torch.full((1, 2, 6, 3), 4.0), width=6)  # a wider row: the cache is copied
    assert wider.data_ptr() != back.data_ptr() and wider.shape == (6, 2, 6, 3)
    assert torch.equal(wider[:5, :, 2:], back) and not wider[:5, :, :2].any() and (wider[5] == 4).all()
