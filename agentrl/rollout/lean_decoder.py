"""One decode step of a Llama-family model, without the Hugging Face forward's plumbing.

For a small model a decode step's time is mostly Python: the causal LM's forward builds
masks and position embeddings through generic helpers, routes keyword arguments through
every layer, updates a cache object and wraps outputs, for one token per row. This runs
the same modules in the same order (embedding, rotary embedding, per layer: norm,
q/k/v projections, q/k norms where the model has them, rotary positions, the model's own
SDPA attention function, output projection, norm, MLP; final norm, LM head) on a
ready-made boolean mask, appending each layer's new key and value to the engine's
`DynamicCache` layers. The logits are the forward's to the bit on the models checked
(`LeanDecoder.for_model` compares one step against the forward and refuses on any
difference; the engine then keeps the forward).

Prefill stays on the model's forward: it needs causal masks over padded rows, which the
forward builds.
"""

from __future__ import annotations

import sys

import torch

from agentrl.rollout.torch_engine import cache_keyword

# Architectures whose decoder layer is exactly: x + attn(input_layernorm(x)), then
# x + mlp(post_attention_layernorm(x)), with q/k/v/o projections, optional q/k norms
# applied per head before rotary positions, and full attention.
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


class LeanDecoder:
    def __init__(self, model):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        self.model = model
        self.body = model.model
        self.layers = list(self.body.layers)
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.attention = sdpa_attention_forward
        self.apply_rotary = sys.modules[type(first).__module__].apply_rotary_pos_emb
        self.qk_norms = hasattr(first, "q_norm") and hasattr(first, "k_norm")

    @classmethod
    def for_model(cls, model) -> LeanDecoder | None:
        """A decoder for `model`, or None where it is not a checked family, or one step differs from the forward."""
        config = model.config
        if getattr(config, "model_type", None) not in FAMILIES:
            return None
        if getattr(config, "_attn_implementation", None) != "sdpa":
            return None
        # The continuous engine refuses hybrid and sliding-window layer types; Mistral's window is set apart.
        if getattr(config, "use_sliding_window", False) or (config.model_type == "mistral" and config.sliding_window):
            return None
        try:
            decoder = cls(model)
            return decoder if decoder.matches_forward() else None
        except (AttributeError, TypeError, ValueError, RuntimeError):
            return None

    @torch.inference_mode()
    def matches_forward(self) -> bool:
        """Whether one decode step after a short ragged prefill gives the forward's logits exactly."""
        from transformers import DynamicCache

        keyword = cache_keyword(self.model)
        device = next(self.model.parameters()).device
        vocab = self.model.config.vocab_size
        ids = torch.tensor([[1, 2, 3, 4], [0, 5, 6, 7]], device=device) % vocab
        mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        caches = []
        for _ in range(2):
            cache = DynamicCache(config=self.model.config)
            self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **{keyword: cache})
            caches.append(cache)
        token = torch.tensor([8, 9], device=device) % vocab
        step_mask = torch.ones((2, 5), dtype=torch.bool, device=device)
        step_mask[1, 0] = False
        step_positions = positions[:, -1] + 1
        expected = self.model(
            input_ids=token[:, None],
            attention_mask=step_mask.long(),
            position_ids=step_positions[:, None],
            **{keyword: caches[0]},
            use_cache=True,
        ).logits[:, -1, :]
        got = self.decode(token, step_mask, step_positions, caches[1])
        return bool(torch.equal(expected, got))

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """Logits (rows, vocab) of feeding `tokens` (rows,) at `positions` (rows,).

        `mask` (rows, columns) is True where a column holds one of the row's tokens, the new
        one included as the last column; `cache`'s layers get the new keys and values appended.
        """
        rows = tokens.shape[0]
        hidden = self.body.embed_tokens(tokens[:, None])
        cos, sin = self.body.rotary_emb(hidden, positions[:, None])
        attention_mask = mask[:, None, None, :]
        per_head = (rows, 1, -1, self.head_dim)
        for layer, kept in zip(self.layers, cache.layers, strict=True):
            attn = layer.self_attn
            normed = layer.input_layernorm(hidden)
            query = attn.q_proj(normed).view(per_head)
            key = attn.k_proj(normed).view(per_head)
            value = attn.v_proj(normed).view(per_head).transpose(1, 2)
            if self.qk_norms:
                query, key = attn.q_norm(query), attn.k_norm(key)
            query, key = self.apply_rotary(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
            kept.keys = append_column(kept.keys, key)
            kept.values = append_column(kept.values, value)
            out, _ = self.attention(attn, query, kept.keys, kept.values, attention_mask, scaling=attn.scaling)
            hidden = hidden + attn.o_proj(out.reshape(rows, 1, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(self.body.norm(hidden))[:, -1, :]


def append_column(kept: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """`kept` (rows, heads, columns, dim) with `new` (rows, heads, 1, dim) after its last column.

    Written in place where `kept` is a view of a buffer with room after it (one this made),
    so a step copies one column instead of the whole cache; otherwise a buffer with room for
    COLUMN_HEADROOM more columns is made. Views are extended only past their own end,
    where no other tensor looks: trimming and selecting rows make views or copies of
    their own.
    """
    rows, heads, columns, dim = kept.shape
    grown = _view_with_room(kept)
    if grown is None:
        buffer = kept.new_empty((rows, heads, columns + COLUMN_HEADROOM, dim))
        buffer[:, :, :columns] = kept
        grown = buffer[:, :, : columns + 1]
    grown[:, :, columns:] = new
    return grown


COLUMN_HEADROOM = 64


def keep_rows(kept: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The `rows` of `kept`, moved to the front of its own buffer, so the room after its columns stays."""
    kept[: len(rows)] = kept[rows]
    return kept[: len(rows)]


def stack_rows(parts: list[torch.Tensor], columns: int) -> torch.Tensor:
    """`parts` (each rows, heads, its columns, dim) one above the other, right-aligned to `columns`, zeros on
    their left, in a buffer with COLUMN_HEADROOM columns of room after them."""
    first = parts[0]
    rows = sum(part.shape[0] for part in parts)
    buffer = first.new_empty((rows, first.shape[1], columns + COLUMN_HEADROOM, first.shape[3]))
    row = 0
    for part in parts:
        count, width = part.shape[0], part.shape[2]
        buffer[row : row + count, :, : columns - width] = 0
        buffer[row : row + count, :, columns - width : columns] = part
        row += count
    return buffer[:, :, :columns]


def _view_with_room(kept: torch.Tensor) -> torch.Tensor | None:
    """`kept` grown by one column within its buffer, or None if it is not laid out in one with room."""
    rows, heads, columns, dim = kept.shape
    row_stride, head_stride, column_stride, dim_stride = kept.stride()
    if dim_stride != 1 or column_stride != dim or head_stride % dim or row_stride != heads * head_stride:
        return None
    capacity = head_stride // dim
    first_column = (kept.storage_offset() % head_stride) // dim
    if first_column + columns + 1 > capacity:
        return None
    end = kept.storage_offset() + (rows - 1) * row_stride + (heads - 1) * head_stride + (columns + 1) * dim
    if end * kept.element_size() > kept.untyped_storage().nbytes():
        return None
    return kept.as_strided((rows, heads, columns + 1, dim), kept.stride(), kept.storage_offset())
