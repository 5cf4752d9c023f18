"""Steps of fixed shapes over a slot KV cache, captured as CUDA graphs per bucket: decode steps and prefills.

On a GPU a step of a small model is bound by kernel launches, not by the GPU: a 0.5B
model's decode step is some 400 kernels, each launched from Python. A CUDA graph records
the step's kernels once and replays them with one launch. That needs every tensor the
step reads or writes at a fixed address and of a fixed shape, hence `SlotBatch`: the
step's inputs, the KV buffer and the rotary tables stay put, the step runs at a bucket
of rows (`row_bucket`), of new tokens per row (`token_bucket`, prefills) and of attended
columns (`column_bucket`), and each row writes its new keys and values at its own
positions (an indexed write, no host sync).

`static_step` is the lean decoder's computation over the slots (the same ops, so the same
logits up to float rounding): `static_decode` feeds one token per running row,
`static_prefill` feeds joining rows' new tokens straight into their slots, after the
cache a row kept from its last turn. `DecodeGraphs` replays a captured graph per bucket,
captured on first use; without capture (CPU, or `capture=False`) the steps run eagerly,
which is how the CPU tests check the slot logic that the graphs replay.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from agentrl.engine.lean_decoder import LeanDecoder, RMSNormWeights, add_linear
from agentrl.engine.slot_batch import (
    PREFILL_GRAPH_TOKENS,
    PrefillInputs,
    SlotBatch,
    column_bucket,
    row_bucket,
    token_bucket,
)


def static_decode(
    decoder: LeanDecoder, batch: SlotBatch, rows: int, width: int, cos: torch.Tensor, signed_sin: torch.Tensor
) -> torch.Tensor:
    """Feed `batch.tokens_in[:rows]` at `batch.positions_buffer[:rows]`; the next-token logits (rows, vocab).

    Each row's key and value go to its slot at its position; attention reads the first
    `width` columns, those up to the row's position visible. Nothing here depends on the
    values of the inputs, only on `rows` and `width`.
    """
    ids, positions = batch.tokens_in[:rows, None], batch.positions_buffer[:rows, None]
    return static_step(decoder, batch, ids, positions, None, None, width, (cos, signed_sin))


def static_prefill(
    decoder: LeanDecoder, batch: SlotBatch, inputs: PrefillInputs, width: int, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Feed each row's new tokens `inputs.ids` at `inputs.positions` into slot `inputs.slots`, after the cache that
    slot holds; the logits (rows, vocab) after each row's last real token (`inputs.last`). A row's padding tokens
    write columns past its last one, which its next steps overwrite before anything reads them."""
    return static_step(decoder, batch, inputs.ids, inputs.positions, inputs.slots, inputs.last, width, (cos, sin))


def static_step(
    decoder: LeanDecoder,
    batch: SlotBatch,
    ids: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor | None,
    last: torch.Tensor | None,
    width: int,
    rotary: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """The lean decoder's computation for `ids` (rows, tokens) at `positions` over the slot cache: slot `slots[i]`
    (None: slot i) takes row i's keys and values, and its first `width` columns are what row i attends to, up to
    each token's own position. The logits after token `last[i]` of each row (None: the only one). `rotary`: the
    (cos, signed sin) tables by position."""
    cos, signed_sin = rotary
    query_heads, kv_heads, head_dim = decoder.query_heads, decoder.kv_heads, decoder.head_dim
    query_keys = (query_heads + kv_heads) * head_dim
    rows, tokens = ids.shape
    flat = positions.reshape(-1)
    row_slots = torch.arange(rows, device=ids.device) if slots is None else slots
    token_slots = row_slots if tokens == 1 else row_slots[:, None].expand(rows, tokens).reshape(-1)  # no host sync
    hidden = decoder.body.embed_tokens(ids.reshape(-1))
    token_cos, token_sin = cos[flat][:, None, :], signed_sin[flat][:, None, :]
    visible = torch.arange(width, device=ids.device)[None, :] <= flat[:, None]
    seen = torch.zeros((), dtype=hidden.dtype, device=ids.device)
    unseen = torch.full((), -torch.inf, dtype=hidden.dtype, device=ids.device)
    group = query_heads // kv_heads
    # Queries as (rows, kv heads, tokens x group, dim): a kv head's query heads are consecutive, each token's group.
    bias = torch.where(visible, seen, unseen).view(rows, 1, tokens, 1, width)
    bias = bias[:, :, 0] if tokens == 1 else bias.expand(-1, -1, -1, group, -1).reshape(rows, 1, tokens * group, width)
    for layer, weights in enumerate(decoder.weights):
        qkv = F.linear(rms_norm(weights.input_norm, hidden), weights.qkv, weights.qkv_bias)
        query_key = qkv[:, :query_keys].view(-1, query_heads + kv_heads, head_dim)
        value = qkv[:, query_keys:].view(-1, kv_heads, head_dim)
        if weights.q_norm is not None:
            queries, keys = query_key[:, :query_heads], query_key[:, query_heads:]
            query_key = torch.cat([weights.q_norm(queries), weights.k_norm(keys)], dim=1)
        query_key = query_key * token_cos + query_key.roll(head_dim // 2, dims=-1) * token_sin
        keys, values = batch.keys[layer], batch.values[layer]
        keys[token_slots, :, flat] = query_key[:, query_heads:]
        values[token_slots, :, flat] = value
        if slots is None:
            attended_keys, attended_values = keys[:rows, :, :width], values[:rows, :, :width]
        else:
            attended_keys, attended_values = keys[slots, :, :width], values[slots, :, :width]
        query = query_key[:, :query_heads].reshape(rows, tokens, kv_heads, group, head_dim)
        query = query.transpose(1, 2).reshape(rows, kv_heads, tokens * group, head_dim)
        attention = F.scaled_dot_product_attention(
            query, attended_keys, attended_values, attn_mask=bias, scale=weights.scaling
        )
        attention = attention.view(rows, kv_heads, tokens, group, head_dim).transpose(1, 2)
        hidden = add_linear(hidden, attention.reshape(rows * tokens, query_heads * head_dim), *weights.output)
        gate_up = F.linear(rms_norm(weights.post_attention_norm, hidden), weights.gate_up, weights.gate_up_bias)
        inner = weights.inner
        hidden = add_linear(hidden, weights.activation(gate_up[:, :inner]) * gate_up[:, inner:], *weights.down)
    if last is not None:
        hidden = hidden.view(rows, tokens, -1)[torch.arange(rows, device=ids.device), last]
    return F.linear(rms_norm(decoder.final_norm, hidden), *decoder.head)


def rms_norm(norm: RMSNormWeights, x: torch.Tensor) -> torch.Tensor:
    """The model's RMS norm in fewer kernels: normalised in float32 by one fused op, cast back to `x`'s dtype, then
    scaled by the weight in that dtype, as Llama's and Qwen's norms compute it (the module itself otherwise)."""
    if not norm.fused:
        return norm(x)
    normalised = F.rms_norm(x.float(), (x.shape[-1],), None, norm.epsilon)
    return norm.weight * normalised.to(x.dtype)


class DecodeGraphs:
    """Run decode steps of a `SlotBatch`: replayed CUDA graphs (`capture=True`, CUDA only), else eagerly."""

    def __init__(self, decoder: LeanDecoder, capture: bool):
        if not decoder.rotary.static:
            raise ValueError("decode steps of fixed shapes need a rotary table; this model's depends on the length")
        self.decoder = decoder
        self.capture = capture
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # by step and bucket
        self.pool = None
        self.generation = -1  # the batch generation the graphs and tables were made for
        self.weights = self._weights()
        self.cos = self.signed_sin = None
        self.captures = 0
        self.prefill_tokens = PREFILL_GRAPH_TOKENS  # prefills of more new tokens a row run eagerly

    def decode(self, batch: SlotBatch) -> torch.Tensor:
        """Feed `batch.tokens_in` for every row; the next-token logits (rows, vocab). The caller advances the batch."""
        count = len(batch.rows)
        batch.reserve(count, max(batch.lengths) + 1)  # room for each row's new column
        rows = min(row_bucket(count), batch.slots)
        width = min(column_bucket(max(batch.lengths) + 1), batch.columns)
        if rows > count:
            batch.positions_buffer[count:rows] = 0  # padding rows write column 0 of free slots
        if batch.generation != self.generation:
            self._follow(batch)
        step = lambda: static_decode(self.decoder, batch, rows, width, self.cos, self.signed_sin)  # noqa: E731
        return (self._replay(("decode", rows, width), step) if self.capture else step())[:count]

    def prefill(
        self,
        batch: SlotBatch,
        stored: list[torch.Tensor | None],
        new: list[list[int]],
        slots: list[int] | None = None,
    ) -> torch.Tensor:
        """Prefill rows into slots after the batch's last row: row i's stored cache `stored[i]` (from
        `SlotBatch.stored_kv`, or None), then its `new` tokens, into slot `slots[i]` (by default the slots right
        after the last row, in order); the logits (rows, vocab) after each row's last token. The caller joins the
        rows to the batch."""
        first, added = len(batch.rows), len(new)
        slots = list(range(first, first + added)) if slots is None else list(slots)
        past = [0 if kv is None else kv.shape[3] for kv in stored]
        tokens = token_bucket(max(map(len, new)))
        reach = max(past) + tokens  # the columns the widest row's prefill writes, padding included
        batch.reserve(max(max(slots) + 1, min(first + row_bucket(added), batch.max_rows)), reach + 1)
        rows = min(row_bucket(added), batch.slots - first)  # padding rows prefill free slots
        taken = set(slots)
        padding = list(itertools.islice((s for s in itertools.count(first) if s not in taken), rows - added))
        width = min(column_bucket(reach), batch.columns)
        for slot, kv in zip(slots, stored, strict=True):
            if kv is not None:
                batch.restore(slot, kv)
        if batch.generation != self.generation:
            self._follow(batch)
        captured = self.capture and tokens <= min(self.prefill_tokens, PREFILL_GRAPH_TOKENS)
        inputs = PrefillInputs(batch.prefill_buffer, rows, tokens)
        inputs.write(_prefill_host_inputs(new, past, tokens, slots + padding, pin=batch.device.type == "cuda"))
        if not captured:
            return static_prefill(self.decoder, batch, inputs, width, self.cos, self.signed_sin)[:added]
        step = lambda: static_prefill(self.decoder, batch, inputs, width, self.cos, self.signed_sin)  # noqa: E731
        return self._replay(("prefill", rows, tokens, width), step)[:added].clone()

    def check_weights(self) -> None:
        """Drop every graph if the decoder's tensors moved (parameters replaced, not copied into)."""
        weights = self._weights()
        if weights != self.weights:
            self._drop_graphs()
            self.weights = weights

    def _weights(self) -> tuple[int, ...]:
        decoder = self.decoder
        tensors = [decoder.body.embed_tokens.weight, decoder.final_norm.weight, decoder.head[0]]
        for weights in decoder.weights:
            tensors += [weights.qkv, weights.gate_up, weights.output[0], weights.down[0]]
            tensors += [weights.input_norm.weight, weights.post_attention_norm.weight]
        return tuple(tensor.data_ptr() for tensor in tensors)

    def _follow(self, batch: SlotBatch) -> None:
        """New buffers: the graphs read the old ones; rotary tables as long as the new columns."""
        self._drop_graphs()
        self.generation = batch.generation
        probe = torch.zeros((1, 1), dtype=batch.dtype, device=batch.device)
        self.decoder.rotary(probe, torch.tensor([batch.columns - 1], device=batch.device))
        self.cos, self.signed_sin = self.decoder.rotary.cos, self.decoder.rotary.signed_sin

    def _drop_graphs(self) -> None:
        """Free every graph and their memory pool: capturing into a pool whose graphs are all gone trips an internal
        assert of the caching allocator (seen on torch 2.11), so new graphs get a new pool."""
        self.graphs.clear()
        self.pool = None

    def _replay(self, key: tuple, step) -> torch.Tensor:
        """Replay the graph of `key`, captured from `step` on first use; its output."""
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._record(step)
        entry[0].replay()
        return entry[1]

    def _record(self, step) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture `step`. A warm-up on a side stream first (lazy library set-up must not happen during capture); its
        key and value writes are the ones the replay makes again."""
        device = self.decoder.body.embed_tokens.weight.device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (the rank's main thread) must not break this thread's capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = step()
        self.captures += 1
        return graph, logits


def _prefill_host_inputs(new: list[list[int]], past: list[int], tokens: int, slots: list[int], pin: bool):
    """`PrefillInputs`' buffer on the host: row i (slot `slots[i]`) feeds `new[i]` from position `past[i]`, its
    padding continues its positions; padding rows (past `len(new)`) feed token 0 from position 0 into free slots."""
    rows = len(slots)
    ids = torch.zeros((rows, tokens), dtype=torch.long)
    positions = torch.arange(tokens).repeat(rows, 1)
    for i, (row_tokens, start) in enumerate(zip(new, past, strict=True)):
        ids[i, : len(row_tokens)] = torch.tensor(row_tokens, dtype=torch.long)
        positions[i] += start
    slots = torch.tensor(slots, dtype=torch.long)
    last = torch.tensor([len(row_tokens) - 1 for row_tokens in new] + [0] * (rows - len(new)), dtype=torch.long)
    host = torch.cat([ids.reshape(-1), positions.reshape(-1), slots, last])
    return host.pin_memory() if pin else host
