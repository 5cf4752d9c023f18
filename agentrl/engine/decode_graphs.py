"""Decode steps of fixed shapes over a slot KV cache, captured as CUDA graphs per batch-size bucket.

On a GPU a decode step of a small model is bound by kernel launches, not by the GPU: a
0.5B model's step is some 400 kernels, each launched from Python. A CUDA graph records
the step's kernels once and replays them with one launch. That needs every tensor the
step reads or writes at a fixed address and of a fixed shape, hence `SlotBatch`: the
step's input tokens and positions, the KV buffers and the rotary tables stay put, the
step runs at a bucket of rows (`row_bucket`) and of attended columns (`column_bucket`),
and each row writes its new key and value at its own position (an indexed write, no
host sync).

`static_decode` is the step itself, the lean decoder's computation for one token per
row (the same ops, so the same logits up to float rounding). `DecodeGraphs` replays a
captured graph per (rows, columns) bucket, captured on first use; without capture (CPU,
or `capture=False`) it runs `static_decode` eagerly, which is how the CPU tests check
the slot logic that the graphs replay.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from agentrl.engine.lean_decoder import LeanDecoder, RMSNormWeights, add_linear
from agentrl.engine.slot_batch import SlotBatch, column_bucket, row_bucket


def static_decode(
    decoder: LeanDecoder, batch: SlotBatch, rows: int, width: int, cos: torch.Tensor, signed_sin: torch.Tensor
) -> torch.Tensor:
    """Feed `batch.tokens_in[:rows]` at `batch.positions_buffer[:rows]`; the next-token logits (rows, vocab).

    Each row's key and value go to its slot at its position; attention reads the first
    `width` columns, those up to the row's position visible. Nothing here depends on the
    values of the inputs, only on `rows` and `width`.
    """
    query_heads, kv_heads, head_dim = decoder.query_heads, decoder.kv_heads, decoder.head_dim
    query_keys = (query_heads + kv_heads) * head_dim
    ids, positions = batch.tokens_in[:rows], batch.positions_buffer[:rows]
    slots = torch.arange(rows, device=ids.device)
    hidden = decoder.body.embed_tokens(ids)
    row_cos, row_sin = cos[positions][:, None, :], signed_sin[positions][:, None, :]
    visible = torch.arange(width, device=ids.device)[None, :] <= positions[:, None]
    seen = torch.zeros((), dtype=hidden.dtype, device=ids.device)
    unseen = torch.full((), -torch.inf, dtype=hidden.dtype, device=ids.device)
    bias = torch.where(visible, seen, unseen)[:, None, None, :]
    group = query_heads // kv_heads
    for layer, weights in enumerate(decoder.weights):
        qkv = F.linear(rms_norm(weights.input_norm, hidden), weights.qkv, weights.qkv_bias)
        query_key = qkv[:, :query_keys].view(rows, query_heads + kv_heads, head_dim)
        value = qkv[:, query_keys:].view(rows, kv_heads, head_dim)
        if weights.q_norm is not None:
            queries, keys = query_key[:, :query_heads], query_key[:, query_heads:]
            query_key = torch.cat([weights.q_norm(queries), weights.k_norm(keys)], dim=1)
        query_key = query_key * row_cos + query_key.roll(head_dim // 2, dims=-1) * row_sin
        keys, values = batch.keys[layer], batch.values[layer]
        keys[slots, :, positions] = query_key[:, query_heads:]
        values[slots, :, positions] = value
        # A kv head's query heads are consecutive: each row attends as kv_heads heads of `group` queries each.
        query = query_key[:, :query_heads].reshape(rows, kv_heads, group, head_dim)
        attention = F.scaled_dot_product_attention(
            query, keys[:rows, :, :width], values[:rows, :, :width], attn_mask=bias, scale=weights.scaling
        )
        hidden = add_linear(hidden, attention.reshape(rows, query_heads * head_dim), *weights.output)
        gate_up = F.linear(rms_norm(weights.post_attention_norm, hidden), weights.gate_up, weights.gate_up_bias)
        inner = weights.inner
        hidden = add_linear(hidden, weights.activation(gate_up[:, :inner]) * gate_up[:, inner:], *weights.down)
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
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.generation = -1  # the batch generation the graphs and tables were made for
        self.weights = self._weights()
        self.cos = self.signed_sin = None
        self.captures = 0

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
        if not self.capture:
            return static_decode(self.decoder, batch, rows, width, self.cos, self.signed_sin)[:count]
        entry = self.graphs.get((rows, width))
        if entry is None:
            entry = self.graphs[(rows, width)] = self._record(batch, rows, width)
        entry[0].replay()
        return entry[1][:count]

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

    def _record(self, batch: SlotBatch, rows: int, width: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture the step at (rows, width). A warm-up on a side stream first (lazy library set-up must not
        happen during capture); its key and value writes are the ones the replay makes again."""
        side = torch.cuda.Stream(device=batch.device)
        side.wait_stream(torch.cuda.current_stream(batch.device))
        with torch.cuda.stream(side):
            static_decode(self.decoder, batch, rows, width, self.cos, self.signed_sin)
        torch.cuda.current_stream(batch.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (the rank's main thread) must not break this thread's capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = static_decode(self.decoder, batch, rows, width, self.cos, self.signed_sin)
        self.captures += 1
        return graph, logits
