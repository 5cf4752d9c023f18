"""What the engines need to know of a Hugging Face model's forward: how it takes its cache and its masks."""

from __future__ import annotations

import inspect

import torch


def cache_keyword(model) -> str:
    """The name the model's forward takes its KV cache by: `cache` from transformers 5.24 on (which warns
    about `past_key_values` on every call), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def takes_ready_made_sdpa_masks(model) -> bool:
    """Whether `model` accepts {"full_attention": 4D bool mask} in place of a 2D mask.

    Hugging Face models that support compiled generation take the per-layer-type masks
    ready-made (as `generate` passes them with a static cache); with SDPA and only
    full-attention layers that mapping is a single boolean mask.
    """
    config = model.config
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return (
        bool(getattr(model, "_can_compile_fullgraph", False))
        and getattr(config, "_attn_implementation", None) == "sdpa"
        and layer_types == {"full_attention"}
        and not getattr(config, "is_encoder_decoder", False)
        and _takes_mask_mapping(model)
    )


@torch.inference_mode()
def _takes_mask_mapping(model) -> bool:
    """Whether one token goes through the forward with its mask as a mapping: some models (Llama, DeepSeek-V3,
    GLM-4.5 in transformers 5.17) build their mask from a tensor only."""
    device = next(model.parameters()).device
    mask = {"full_attention": torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)}
    try:
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), attention_mask=mask, use_cache=False)
    except (AttributeError, TypeError):  # the model's mask builder reads the mapping as a tensor
        return False
    return True
