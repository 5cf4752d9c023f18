"""agentrl.rollout.lean_decoder: decode steps bit-identical to the model's forward, or not used at all."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from agentrl.rollout.continuous_engine import ContinuousTorchEngine
from agentrl.rollout.lean_decoder import LeanDecoder, append_column, keep_rows, stack_rows
from agentrl.rollout.torch_engine import cache_keyword

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


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_many_ragged_decode_steps_equal_the_forward_to_the_bit(family):
    model = build(family)
    decoder = LeanDecoder.for_model(model)
    assert decoder is not None
    # three rows, left-padded to different lengths, with a hole (a masked column) in the middle row
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 11, 0, 13, 14], [0, 0, 0, 21, 22]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 0, 1, 1], [0, 0, 0, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    forward_cache, lean_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
    for cache in (forward_cache, lean_cache):
        model(input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_keyword(model): cache})
    next_positions = positions[:, -1] + 1
    tokens = torch.tensor([30, 31, 32])
    for _ in range(12):
        mask = torch.cat([mask, torch.ones((3, 1), dtype=mask.dtype)], dim=1)
        expected = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=next_positions[:, None],
            **{cache_keyword(model): forward_cache},
        ).logits[:, -1, :]
        got = decoder.decode(tokens, mask.bool(), next_positions, lean_cache)
        assert torch.equal(got, expected)
        tokens, next_positions = expected.argmax(-1), next_positions + 1
    for forward_layer, lean_layer in zip(forward_cache.layers, lean_cache.layers, strict=True):
        assert torch.equal(forward_layer.keys, lean_layer.keys) and torch.equal(forward_layer.values, lean_layer.values)


def test_models_it_does_not_cover_keep_the_forward():
    assert LeanDecoder.for_model(build("qwen2", attention="eager")) is None  # eager attention rounds differently

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
    grown = append_column(kept, new)  # a plain tensor has no room: copied once into a buffer with room
    assert torch.equal(grown, torch.cat([kept, new], dim=2))
    again = append_column(grown, 2 * new)
    assert again.data_ptr() == grown.data_ptr()  # written in place, one column
    assert torch.equal(again, torch.cat([kept, new, 2 * new], dim=2))

    trimmed = keep_rows(again[:, :, 2:], torch.tensor([2, 0]))  # rows leave, columns only they used go
    assert torch.equal(trimmed, torch.cat([kept, new, 2 * new], dim=2)[[2, 0], :, 2:])
    grown_again = append_column(trimmed, new[:2])
    assert grown_again.data_ptr() == trimmed.data_ptr()
    assert torch.equal(grown_again[:, :, -1:], new[:2])

    stacked = stack_rows([trimmed, torch.ones(1, 2, 3, 4)], columns=6)
    assert stacked.shape == (3, 2, 6, 4)
    assert torch.equal(stacked[:2, :, 1:], trimmed) and torch.equal(stacked[2, :, 3:], torch.ones(2, 3, 4))
    assert not stacked[:2, :, :1].any() and not stacked[2, :, :3].any()  # zeros on the left of shorter rows
    assert append_column(stacked, torch.zeros(3, 2, 1, 4)).data_ptr() == stacked.data_ptr()
