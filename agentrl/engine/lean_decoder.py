"""Prefill and decode steps of a Llama-family model in few tensor ops.

For a small model most of a step is Python and per-op overhead: the causal LM's forward
builds masks and position embeddings through generic helpers, routes keyword arguments
through every layer, updates a cache object and wraps its outputs, and runs three
projections where one matrix product would do. `LeanDecoder` runs the same computation
on a mask the engine builds:

- several feeds in one pass (`Feed`: a decode step's one token per row, a prefill's new
  tokens): their tokens go through the projections, norms and MLPs as one flat batch,
  only attention runs per feed, over the feed's own cache;
- q/k/v projections as one matrix product, gate and up projections as another: the
  model's q/k/v (and gate/up) parameters become row blocks of one tensor each, so weight
  loads that copy into the parameters reach the fused products too;
- rotary positions looked up in a table of the model's own values (`RotaryTable`) and
  applied to the queries and keys together;
- attention as two matrix products around a softmax, grouped-query heads without
  repeating the keys;
- the output and down projections adding onto the residual in their matrix product;
- the model's own embedding, norms (one fused op in float32), activation and LM head.

The results equal the forward's up to float rounding (`LeanDecoder.for_model` runs ragged
prefills and a decode step, alone and in one pass, both ways and refuses on a larger
difference; the engine then keeps the forward). New keys and values go into buffers with
room after them (`append_columns`), so a step writes its columns instead of copying the cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F

from agentrl.engine.hf import cache_keyword

# Architectures whose decoder layer is exactly: x + attn(input_layernorm(x)), then
# x + mlp(post_attention_layernorm(x)), with q/k/v/o projections, optional q/k norms
# applied per head before rotary positions, a gated MLP, and full attention.
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
# How far the lean logits may be from the forward's (relative to the largest logit) in float32.
MATCH_TOLERANCE = 1e-5
T = TypeVar("T")


def full_attention_family(config) -> bool:
    """A checked family (FAMILIES) whose layers attend over whole sequences: the continuous engine refuses hybrid and
    sliding-window layer types; Mistral's and Qwen2's windows are set apart here."""
    if getattr(config, "model_type", None) not in FAMILIES:
        return False
    windowed = config.model_type == "mistral" and config.sliding_window
    return not (getattr(config, "use_sliding_window", False) or windowed)


class LeanDecoder:
    def __init__(self, model):
        config = model.config
        self.model = model
        self.body = model.model
        self.layers = list(self.body.layers)
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.query_heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.query_heads
        self.weights: list[LayerWeights] = []
        self.rotary = RotaryTable(self.body.rotary_emb)
        self.refresh()

    def refresh(self) -> None:
        """Take the model's parameters again where any was replaced (not copied into) since the last look.

        Weight loads that copy into the parameters need none of this: the engine calls it at
        every new weight version, in case a parameter was swapped for a new one.
        """
        self.weights = [
            kept if kept is not None and kept.current() else LayerWeights(layer)
            for kept, layer in itertools.zip_longest(self.weights, self.layers)
        ]
        self.final_norm = RMSNormWeights(self.body.norm)
        self.head = (self.model.lm_head.weight, self.model.lm_head.bias)

    @classmethod
    def for_model(cls, model) -> LeanDecoder | None:
        """A decoder for `model`, or None where it is not a checked family, or its steps differ from the forward."""
        config = model.config
        if not full_attention_family(config) or getattr(config, "_attn_implementation", None) != "sdpa":
            return None
        return built_if_matching(lambda: cls(model))

    @torch.inference_mode()
    def matches_forward(self) -> bool:
        """Whether ragged prefills (one after a kept past with a hole) and a decode step, alone and in one pass with
        a prefill, give the forward's logits."""
        from transformers import DynamicCache

        self.refresh()
        keyword = cache_keyword(self.model)
        device = next(self.model.parameters()).device
        vocab = self.model.config.vocab_size
        ids = torch.tensor([[1, 2, 3, 4], [0, 5, 6, 7]], device=device) % vocab
        mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        more = torch.tensor([[10, 11], [0, 12]], device=device) % vocab
        more_mask = torch.cat([mask, torch.tensor([[1, 1], [0, 1]], device=device)], dim=1)
        more_positions = positions[:, -1:] + torch.tensor([[1, 2], [0, 1]], device=device)
        token = torch.tensor([8, 9], device=device) % vocab
        step_mask = torch.cat([more_mask, torch.ones((2, 1), dtype=mask.dtype, device=device)], dim=1)
        step_positions = more_positions[:, -1] + 1
        forward_cache, lean_cache = DynamicCache(config=self.model.config), DynamicCache(config=self.model.config)

        def forward(ids, mask, positions):
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **{keyword: forward_cache})
            return out.logits[:, -1, :]

        first = forward(ids, mask, positions)
        pairs = [
            (first, self.prefill(ids, mask, positions, lean_cache)),
            (forward(more, more_mask, more_positions), self.prefill(more, more_mask, more_positions, lean_cache)),
        ]
        # A decode step and a fresh prefill in one pass, as the engine feeds them.
        step, fresh = self.forward(
            [
                Feed.decode(token, step_mask.bool(), step_positions, lean_cache),
                Feed.prefill(ids, mask, positions, DynamicCache(config=self.model.config)),
            ]
        )
        pairs += [(forward(token[:, None], step_mask, step_positions[:, None]), step), (first, fresh)]
        return all(close_enough(expected, got) for expected, got in pairs)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """Logits (rows, vocab) after feeding `ids` (rows, new columns) at `positions` (rows, new columns).

        `mask` (rows, kept + new columns) is 1 where a column holds one of the row's tokens:
        the cache's kept columns, then the new ones. Each new token sees the row's columns up to
        its own; padding sees only itself.
        """
        return self.forward([Feed.prefill(ids, mask, positions, cache)])[0]

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """Logits (rows, vocab) of feeding `tokens` (rows,) at `positions` (rows,).

        `mask` (rows, columns) is True where a column holds one of the row's tokens, the new
        one included as the last column; `cache`'s layers get the new keys and values appended.
        """
        return self.forward([Feed.decode(tokens, mask, positions, cache)])[0]

    def forward(self, feeds: list[Feed]) -> list[torch.Tensor]:
        """Each feed's last-position logits (its rows, vocab), from one pass over all of them.

        The feeds' tokens go through the projections, norms and MLPs as one flat batch; only
        attention runs per feed, over that feed's own cache. So a decode step and a prefill of
        newly admitted rows cost one pass, not two. The last layer's attention, MLP and the LM
        head run on each row's last token only (a prefill's other tokens leave their keys and
        values in the cache, and nothing else is read of them).
        """
        query_heads, kv_heads, head_dim = self.query_heads, self.kv_heads, self.head_dim
        query_keys = (query_heads + kv_heads) * head_dim
        ids = torch.cat([feed.ids.reshape(-1) for feed in feeds]) if len(feeds) > 1 else feeds[0].ids.reshape(-1)
        positions = torch.cat([feed.positions.reshape(-1) for feed in feeds]) if len(feeds) > 1 else feeds[0].positions
        tokens = ids.numel()
        real = _real_tokens(feeds)  # padding skips the projections and MLPs; attention sees it laid out again
        if real is not None:
            ids, positions = ids[real], positions.reshape(-1)[real]
        hidden = self.body.embed_tokens(ids)
        cos, signed_sin = self.rotary(hidden, positions.reshape(-1))
        biases = [feed.bias(hidden.dtype) for feed in feeds]
        split = _splitter([feed.ids.numel() for feed in feeds])
        last_layer = len(self.weights) - 1
        for layer, weights in enumerate(self.weights):
            qkv = F.linear(weights.input_norm(hidden), weights.qkv, weights.qkv_bias)
            query_key = qkv[:, :query_keys].view(-1, query_heads + kv_heads, head_dim)
            value = qkv[:, query_keys:].view(-1, kv_heads, head_dim)
            if weights.q_norm is not None:
                queries, keys = query_key[:, :query_heads], query_key[:, query_heads:]
                query_key = torch.cat([weights.q_norm(queries), weights.k_norm(keys)], dim=1)
            query_key = rotate(query_key, cos, signed_sin)
            if real is not None:
                query_key, value = _spread(query_key, real, tokens), _spread(value, real, tokens)
            attended = []
            # the last layer goes on from each row's last token alone: the only logits read (every token's keys and
            # values are kept, for the tokens after it)
            only_last = layer == last_layer
            for feed, bias, own, own_value in zip(feeds, biases, split(query_key), split(value), strict=True):
                rows, width = feed.ids.shape
                kept = feed.cache.layers[layer]
                own = own.view(rows, width, query_heads + kv_heads, head_dim)
                own_value = own_value.view(rows, width, kv_heads, head_dim)
                if not getattr(kept, "is_initialized", True):
                    kept.lazy_initialization(own_value, own_value)
                kept.keys = append_columns(kept.keys, own[:, :, query_heads:].transpose(1, 2))
                kept.values = append_columns(kept.values, own_value.transpose(1, 2))
                if only_last:
                    own, bias = own[:, -1:], bias[:, :, -1:]
                query = own[:, :, :query_heads].transpose(1, 2) * weights.scaling
                attended.append(attend(query, kept.keys, kept.values, bias))
            attention = attended[0] if len(attended) == 1 else torch.cat(attended)
            if only_last:
                hidden = hidden[_last_real(feeds)] if real is not None else _last_tokens(split(hidden), feeds)
            elif real is not None:
                attention = attention[real]
            hidden = add_linear(hidden, attention, *weights.output)
            gate_up = F.linear(weights.post_attention_norm(hidden), weights.gate_up, weights.gate_up_bias)
            inner = weights.inner
            hidden = add_linear(hidden, weights.activation(gate_up[:, :inner]) * gate_up[:, inner:], *weights.down)
        logits = F.linear(self.final_norm(hidden), *self.head)
        return list(logits.split([feed.ids.shape[0] for feed in feeds])) if len(feeds) > 1 else [logits]


def _splitter(counts: list[int]):
    """A function giving the per-feed parts (of `counts` rows each) of a flat tensor."""
    if len(counts) == 1:
        return lambda flat: (flat,)
    return lambda flat: flat.split(counts)


def _last_tokens(parts, feeds: list[Feed]) -> torch.Tensor:
    """The hidden states (all feeds' rows, hidden) of each row's last token, from each feed's flat part."""
    last = []
    for part, feed in zip(parts, feeds, strict=True):
        rows, width = feed.ids.shape
        last.append(part if width == 1 else part.view(rows, width, -1)[:, -1])
    return last[0] if len(last) == 1 else torch.cat(last)


def _real_tokens(feeds: list[Feed]) -> torch.Tensor | None:
    """Indices of the flat batch's real (not padding) tokens; None when no feed has padding to skip, or when a
    padded feed's rows are not right-aligned.

    Only feeds of right-aligned rows (each row's last new token real, as admissions lay them
    out) are compacted, so a row's last real token is the last of its run in the flat batch.
    """
    padded = [feed.real is not None for feed in feeds]
    if not any(padded) or not all(feed.real[:, -1].all() for feed in feeds if feed.real is not None):
        return None
    flags = [
        feed.real.reshape(-1)
        if feed.real is not None
        else torch.ones(feed.ids.numel(), dtype=torch.bool, device=feed.ids.device)
        for feed in feeds
    ]
    return (torch.cat(flags) if len(flags) > 1 else flags[0]).nonzero().squeeze(1)


def _last_real(feeds: list[Feed]) -> torch.Tensor:
    """Where each row's last token lies among the real tokens (`_real_tokens`), all feeds' rows in order."""
    counts = torch.cat(
        [
            feed.real.sum(dim=1)
            if feed.real is not None
            else torch.full((feed.ids.shape[0],), feed.ids.shape[1], device=feed.ids.device)
            for feed in feeds
        ]
    )
    return counts.cumsum(0) - 1


def _spread(compact: torch.Tensor, real: torch.Tensor, tokens: int) -> torch.Tensor:
    """The real tokens' rows laid out at their places among `tokens`, zeros where padding was."""
    return compact.new_zeros((tokens, *compact.shape[1:])).index_copy_(0, real, compact)


class Feed:
    """Tokens to feed through the model at their positions, what each of them sees, and the cache they extend.

    `ids` and `positions` are (rows, new columns); `visible` (rows, 1, new columns, all
    columns) is True where a new token sees a column: the cache's kept columns, then the new ones.
    """

    def __init__(self, ids: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor, cache, real=None):
        self.ids, self.visible, self.positions, self.cache = ids, visible, positions, cache
        self.real = real  # (rows, new columns) True where a new token is not padding; None: no padding

    @classmethod
    def prefill(cls, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> Feed:
        """New tokens `ids` after `cache`'s kept columns; `mask` (rows, kept + new columns) is 1 where a column
        holds one of the row's tokens. Each new token sees the row's columns up to its own; padding sees only itself."""
        width = ids.shape[1]
        columns = mask.shape[1]
        kept = columns - width
        column = torch.arange(columns, device=ids.device)
        own = (kept + torch.arange(width, device=ids.device))[:, None]
        visible = (mask.bool()[:, None, :] & (column <= own)) | (column == own)
        real = mask[:, kept:].bool()
        return cls(ids, visible[:, None], positions, cache, None if bool(real.all()) else real)

    @classmethod
    def decode(cls, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> Feed:
        """One new token per row; `mask` (rows, columns) is True where a column holds one of the row's tokens,
        the new one included as the last column."""
        return cls(tokens[:, None], mask[:, None, None, :], positions[:, None], cache)

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """0 where visible, -inf where not."""
        device = self.visible.device
        seen, unseen = (
            torch.zeros((), dtype=dtype, device=device),
            torch.full((), -torch.inf, dtype=dtype, device=device),
        )
        return torch.where(self.visible, seen, unseen)


class LayerWeights:
    """What a lean step needs of one decoder layer: its q/k/v projections fused into one matrix
    product and its gate/up projections into another, and the other parameters as tensors.

    The model's q/k/v and gate/up parameters become row blocks (views) of the fused tensors,
    so weights copied into the parameters reach the fused products too.
    """

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.layer = layer
        self.attention_projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.mlp_projections = [mlp.gate_proj, mlp.up_proj]
        self.parameters = list(layer.parameters())
        self.qkv, self.qkv_bias = fuse_rows(self.attention_projections)
        self.gate_up, self.gate_up_bias = fuse_rows(self.mlp_projections)
        self.output = (attn.o_proj.weight, attn.o_proj.bias)
        self.down = (mlp.down_proj.weight, mlp.down_proj.bias)
        self.inner = mlp.gate_proj.weight.shape[0]
        self.activation = mlp.act_fn
        self.scaling = attn.scaling
        self.input_norm = RMSNormWeights(layer.input_layernorm)
        self.post_attention_norm = RMSNormWeights(layer.post_attention_layernorm)
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)

    def current(self) -> bool:
        """Whether the layer still has the parameters this took, and q/k/v and gate/up still view the fused tensors."""
        now = list(self.layer.parameters())
        same = len(now) == len(self.parameters) and all(a is b for a, b in zip(now, self.parameters, strict=True))
        return same and is_fused(self.attention_projections, self.qkv) and is_fused(self.mlp_projections, self.gate_up)


class RMSNormWeights:
    """An RMS norm as one fused op where the model computes it in float32 anyway; the module itself otherwise."""

    def __init__(self, norm):
        self.norm = norm
        self.weight = norm.weight
        self.epsilon = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        self.fused = type(norm).__name__.endswith("RMSNorm") and self.epsilon is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.epsilon)
        return self.norm(x)


def fuse_rows(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Put the weights (and biases, if all have one) of `linears` one above the other in one tensor each
    (`stacked`), and make each linear's parameters views of its rows."""
    has_bias = [linear.bias is not None for linear in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("some projections have a bias and some do not")
    with torch.no_grad():
        weight = stacked([linear.weight.detach() for linear in linears])
        bias = stacked([linear.bias.detach() for linear in linears]) if all(has_bias) else None
        row = 0
        for linear in linears:
            count = linear.weight.shape[0]
            linear.weight.data = weight[row : row + count]
            if bias is not None:
                linear.bias.data = bias[row : row + count]
            row += count
    return weight, bias


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`tensors` one above the other: a view where they already lie back to back in one storage (weights
    mapped from a shared-memory window), else a new tensor."""
    first = tensors[0]
    storage = first.untyped_storage()
    end = first.data_ptr()
    for tensor in tensors:
        if not (
            tensor.is_contiguous()
            and tensor.dtype == first.dtype
            and tensor.shape[1:] == first.shape[1:]
            and tensor.untyped_storage().data_ptr() == storage.data_ptr()
            and tensor.data_ptr() == end
        ):
            return torch.cat(tensors)
        end += tensor.numel() * tensor.element_size()
    rows = sum(tensor.shape[0] for tensor in tensors)
    return first.new_empty(0).set_(storage, first.storage_offset(), (rows, *first.shape[1:]))


def is_fused(linears, weight: torch.Tensor) -> bool:
    start = weight.data_ptr()
    step = weight.stride(0) * weight.element_size()
    row = 0
    for linear in linears:
        if linear.weight.data_ptr() != start + row * step:
            return False
        row += linear.weight.shape[0]
    return True


class RotaryTable:
    """The rotary embedding's cos and sign-flipped sin (`rotation_sin`) of every position, looked up, not computed
    at every step: the model's own values, taken once for positions up to twice the furthest seen so far.

    Rotary types that change with the sequence length (dynamic, longrope) are computed by the model every time.
    """

    def __init__(self, rotary):
        self.rotary = rotary
        self.static = getattr(rotary, "rope_type", "default") not in ("dynamic", "longrope")
        self.cos = self.signed_sin = None

    def __call__(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (positions, 1, head_dim) of the flat `positions`, in `hidden`'s dtype."""
        if not self.static:
            cos, sin = self.rotary(hidden, positions[None])
            return cos[0, :, None, :], rotation_sin(sin)[0, :, None, :]
        furthest = int(positions.max())
        if self.cos is None or self.cos.dtype != hidden.dtype or furthest >= self.cos.shape[0]:
            every = torch.arange(max(256, 2 * (furthest + 1)), device=hidden.device)[None]
            cos, sin = self.rotary(hidden, every)
            self.cos, self.signed_sin = cos[0], rotation_sin(sin)[0]
        return self.cos[positions][:, None, :], self.signed_sin[positions][:, None, :]


def add_linear(
    residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`residual + F.linear(x, weight, bias)`; one matrix product adding onto the residual where there is no bias."""
    if bias is None:
        return torch.addmm(residual, x, weight.t())
    return residual + F.linear(x, weight, bias)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions applied to `x` (..., head_dim), with `RotaryTable`'s cos and signed sin."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def built_if_matching(build: Callable[[], T]) -> T | None:
    """`build()`, where its `matches_forward()` holds; None where it does not, or where building or checking fails as
    a model of unexpected modules makes it fail."""
    try:
        built = build()
        return built if built.matches_forward() else None
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None


def rotation_sin(sin: torch.Tensor) -> torch.Tensor:
    """`sin` with its first half negated: x * cos + x.roll(half) * this is rotary's x * cos + rotate_half(x) * sin."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Attention of scaled `query` (rows, query heads, new, head_dim) over `keys`/`values` (rows, kv heads,
    columns, head_dim), with `bias` (rows, 1, new, columns): 0 where visible, -inf where not.
    Returns (rows x new, query heads x head_dim)."""
    rows, query_heads, width, head_dim = query.shape
    kv_heads, columns = keys.shape[1], keys.shape[2]
    group = query_heads // kv_heads
    grouped = query.reshape(rows, kv_heads, group * width, head_dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2))
    if group > 1:
        scores = (scores.view(rows, kv_heads, group, width, columns) + bias[:, :, None]).view_as(scores)
    else:
        scores = scores + bias
    out = torch.matmul(scores.softmax(dim=-1), values)  # rows, kv heads, group x new, head_dim
    return out.view(rows, query_heads, width, head_dim).transpose(1, 2).reshape(rows * width, query_heads * head_dim)


def close_enough(expected: torch.Tensor, got: torch.Tensor) -> bool:
    if expected.shape != got.shape or not torch.isfinite(got).all():
        return False
    tolerance = MATCH_TOLERANCE if expected.dtype == torch.float32 else 8 * torch.finfo(expected.dtype).eps
    return bool((expected - got).abs().max() <= tolerance * max(1.0, float(expected.abs().max())))


def append_columns(kept: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """`kept` (rows, heads, columns, dim) with `new` (rows, heads, its columns, dim) after its last column.

    Written in place where `kept` is a view of a buffer with room after it (one this made),
    so a step copies its new columns instead of the whole cache; otherwise a buffer with
    room for COLUMN_HEADROOM more columns is made. Views are extended only past their own
    end, where no other tensor looks: trimming and selecting rows make views or copies of
    their own. An empty or missing `kept` starts a buffer.
    """
    added = new.shape[2]
    if kept is None or kept.dim() != 4:
        kept = new[:, :, :0]
    rows, heads, columns, dim = kept.shape
    grown = _view_with_room(kept, added)
    if grown is None:
        buffer = new.new_empty((rows, heads, columns + added + COLUMN_HEADROOM, dim))
        buffer[:, :, :columns] = kept
        grown = buffer[:, :, : columns + added]
    grown[:, :, columns:] = new
    return grown


COLUMN_HEADROOM = 64


def _view_with_room(kept: torch.Tensor, added: int) -> torch.Tensor | None:
    """`kept` grown by `added` columns within its buffer, or None if it is not laid out in one with room."""
    rows, heads, columns, dim = kept.shape
    row_stride, head_stride, column_stride, dim_stride = kept.stride()
    if dim_stride != 1 or column_stride != dim or head_stride % dim or row_stride != heads * head_stride:
        return None
    capacity = head_stride // dim
    first_column = (kept.storage_offset() % head_stride) // dim
    if first_column + columns + added > capacity:
        return None
    end = kept.storage_offset() + (rows - 1) * row_stride + (heads - 1) * head_stride + (columns + added) * dim
    if end * kept.element_size() > kept.untyped_storage().nbytes():
        return None
    return kept.as_strided((rows, heads, columns + added, dim), kept.stride(), kept.storage_offset())
