"""The trainer's forward of the policy (and the KL reference) in few tensor ops; the cached shared-prefix layout in
one pass.

The causal LM's forward builds its mask and position embeddings through generic helpers and routes keyword arguments
through every layer; on a small model that is much of a micro-batch's forward and backward. `LeanForward` runs the
same layers on what the trainer forwards:

- `rows`: whole right-padded rows, causally (no mask);
- `packed`: packed sequences or prefix trees (`shared_prefix.Packing`) under their 4D mask;
- `split`: the cached layout (`shared_prefix.CachedRows`) in one forward: the prefixes and every row's rest go through
  the projections and MLPs as one flat batch, and only attention is split: each prefix causally over itself, each
  rest over its prefix's keys and, causally, its own. The model's forward needs two passes for that (the prefixes,
  then the rests on their KV cache); here the second pass's per-op costs go, and the layout's attention stays
  smaller than packing's, whose rests attend across each other's masked pairs.

It calls the model's own modules (embedding, norms, projections, LoRA adapters where a PEFT wrapper put them,
activation, LM head; rotary positions from the engine's table of the model's values, `RotaryTable`), so the
parameters, their gradients and the optimizer are the model's. Only Llama-family layers (`lean_decoder.FAMILIES`)
qualify, and `for_model` checks every entry point against the model's forward before it is used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from agentrl.engine.lean_decoder import (
    RMSNormWeights,
    RotaryTable,
    built_if_matching,
    close_enough,
    full_attention_family,
    rotate,
)
from agentrl.models.adapters import peft_base


class LeanForward:
    def __init__(self, model):
        base = peft_base(model)
        self.model = model
        self.body = base.model
        self.lm_head = base.lm_head
        first = self.body.layers[0].self_attn
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self.grouped = first.num_key_value_groups > 1
        self.rotary = RotaryTable(self.body.rotary_emb)
        self.norms = [
            (RMSNormWeights(layer.input_layernorm), RMSNormWeights(layer.post_attention_layernorm))
            for layer in self.body.layers
        ]
        self.final_norm = RMSNormWeights(self.body.norm)

    @classmethod
    def for_model(cls, model) -> LeanForward | None:
        """A lean forward of `model`, or None where it is not a checked family or its logits differ from the
        forward's."""
        config = getattr(peft_base(model), "config", None)
        if not full_attention_family(config) or getattr(config, "attention_dropout", 0.0):  # no dropout here
            return None
        return built_if_matching(lambda: cls(model))

    def rows(self, ids: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """(rows x length, vocab) logits of right-padded rows `ids` (rows, length); with `keep`, (len(keep), vocab):
        those flat positions' only (every entry point takes `keep`, see `_logits`). Causal attention alone gives
        each token its row's earlier tokens, the padding coming after them (no mask: the kernel's causal path);
        a padding position sees padding too, whose logits the loss masks."""
        rows, length = ids.shape

        def attend(query, keys, values, kept=None):
            keys, values = (_sequences(t, rows, length) for t in (keys, values))
            if kept is not None:
                row, position = kept // length, kept % length
                visible = torch.arange(length, device=ids.device) <= position[:, None]
                return self._kept_attention(query, keys, values, row, visible)
            return _flat(self._attention(_sequences(query, rows, length), keys, values, is_causal=True))

        positions = torch.arange(length, device=ids.device).repeat(rows)
        return self._logits(ids.reshape(-1), positions, attend, (rows, length), keep)

    def packed(
        self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, keep: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(sequences x length, vocab) logits of packed sequences `ids` (sequences, length) at `positions`, each
        query attending to the keys `allowed` (sequences, 1, length, length) marks."""
        sequences, length = ids.shape

        def attend(query, keys, values, kept=None):
            keys, values = (_sequences(t, sequences, length) for t in (keys, values))
            if kept is not None:
                sequence, position = kept // length, kept % length
                return self._kept_attention(query, keys, values, sequence, allowed[sequence, 0, position])
            return _flat(self._attention(_sequences(query, sequences, length), keys, values, attn_mask=allowed))

        return self._logits(ids.reshape(-1), positions.reshape(-1), attend, (sequences, length), keep)

    def split(
        self,
        prefix_ids: torch.Tensor,
        rest_ids: torch.Tensor,
        rest_positions: torch.Tensor,
        owner: torch.Tensor,
        prefix_visible: torch.Tensor,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(prefixes x head + rows x tail, vocab) logits: the prefixes' positions (`prefix_ids`, (prefixes, head),
        at positions 0..head-1), then the rows' rests' (`rest_ids`, (rows, tail), at `rest_positions`). A rest
        attends to its prefix's (`owner`, (rows,)) keys where `prefix_visible` (rows, head) says, and causally to
        its own."""
        prefixes, head = prefix_ids.shape
        rows, tail = rest_ids.shape
        at = prefixes * head
        causal = torch.ones((tail, tail), dtype=torch.bool, device=rest_ids.device).tril()
        rest_mask = torch.cat(
            [prefix_visible[:, None, :].expand(rows, tail, head), causal.expand(rows, tail, tail)], dim=2
        )[:, None]

        def attend(query, keys, values, kept=None):
            prefix_keys, prefix_values = (_sequences(t[:at], prefixes, head) for t in (keys, values))
            rest_keys, rest_values = (_sequences(t[at:], rows, tail) for t in (keys, values))
            keys = torch.cat([prefix_keys.index_select(0, owner), rest_keys], dim=2)
            values = torch.cat([prefix_values.index_select(0, owner), rest_values], dim=2)
            if kept is not None:  # sorted: the prefixes' kept positions first
                in_prefixes = int((kept < at).sum())
                prefix, position = kept[:in_prefixes] // head, kept[:in_prefixes] % head
                visible = torch.arange(head, device=kept.device) <= position[:, None]
                row, step = (kept[in_prefixes:] - at) // tail, (kept[in_prefixes:] - at) % tail
                return torch.cat(
                    [
                        self._kept_attention(query[:in_prefixes], prefix_keys, prefix_values, prefix, visible),
                        self._kept_attention(query[in_prefixes:], keys, values, row, rest_mask[row, 0, step]),
                    ]
                )
            prefix_query, rest_query = _sequences(query[:at], prefixes, head), _sequences(query[at:], rows, tail)
            prefix_out = self._attention(prefix_query, prefix_keys, prefix_values, is_causal=True)
            rest_out = self._attention(rest_query, keys, values, attn_mask=rest_mask)
            return torch.cat([_flat(prefix_out), _flat(rest_out)])

        positions = torch.arange(head, device=prefix_ids.device).repeat(prefixes)
        ids = torch.cat([prefix_ids.reshape(-1), rest_ids.reshape(-1)])
        return self._logits(ids, torch.cat([positions, rest_positions.reshape(-1)]), attend, keep=keep)

    def _attention(self, query, keys, values, **mask) -> torch.Tensor:
        return F.scaled_dot_product_attention(query, keys, values, scale=self.scaling, enable_gqa=self.grouped, **mask)

    def _kept_attention(self, query, keys, values, sequence, visible) -> torch.Tensor:
        """(queries, heads x head_dim): the attention of `query` (queries, heads, head_dim), query q of sequence
        `sequence[q]` (sorted), over that sequence's `keys` and `values` (sequences, heads, length, head_dim) where
        `visible[q]` (length,) says. A sequence's queries sit side by side, as many slots as the most any has."""
        if sequence.numel() == 0:
            return query.new_zeros(0, query.shape[1] * query.shape[2])
        count, length = keys.shape[0], keys.shape[2]
        per_sequence = torch.bincount(sequence, minlength=count)
        first = per_sequence.cumsum(0) - per_sequence  # each sequence's first query
        slot = torch.arange(sequence.numel(), device=sequence.device) - first[sequence]
        slots = int(per_sequence.max())
        padded = query.new_zeros(count, slots, *query.shape[1:]).index_put((sequence, slot), query)
        mask = torch.zeros((count, 1, slots, length), dtype=torch.bool, device=keys.device)
        mask[..., 0] = True  # an empty slot sees one key: no row without any (its output is not read)
        mask[sequence, 0, slot] = visible
        out = self._attention(padded.transpose(1, 2), keys, values, attn_mask=mask)
        return out.transpose(1, 2)[sequence, slot].flatten(1)

    def _logits(
        self, ids: torch.Tensor, positions: torch.Tensor, attend: Callable, rows=None, keep: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The layers over flat tokens `ids` (tokens,) at `positions`; `attend(query, keys, values)`, each (tokens,
        heads, head_dim), gives the attention's output (tokens, query heads x head_dim); (tokens, vocab) logits. The
        LM head sees the tokens as `rows` (rows, length), where given, as it does in the model's forward.

        `keep` (sorted flat positions): the logits of those tokens only, `attend(query, keys, values, keep)` then
        taking the kept tokens' queries alone. Every layer but the last runs on all tokens, whose keys and values
        later tokens attend to; the last one's keys and values too, and its queries, attention, MLP, the final norm
        and the LM head only on the kept tokens: the trainer keeps the positions that predict a trained token, in a
        multi-turn episode a few of its tokens."""
        hidden = self.body.embed_tokens(ids)
        cos, signed_sin = self.rotary(hidden, positions)
        tokens = ids.shape[0]
        last = self.body.layers[-1]
        for layer, (input_norm, post_attention_norm) in zip(self.body.layers, self.norms, strict=True):
            attention, mlp = layer.self_attn, layer.mlp
            kept = keep if keep is not None and layer is last else None
            x = input_norm(hidden)
            asking = x if kept is None else x.index_select(0, kept)
            query = attention.q_proj(asking).view(asking.shape[0], -1, self.head_dim)
            keys = attention.k_proj(x).view(tokens, -1, self.head_dim)
            values = attention.v_proj(x).view(tokens, -1, self.head_dim)
            if getattr(attention, "q_norm", None) is not None:
                query, keys = attention.q_norm(query), attention.k_norm(keys)
            if kept is None:
                query = rotate(query, cos, signed_sin)
            else:
                query = rotate(query, cos.index_select(0, kept), signed_sin.index_select(0, kept))
                hidden = hidden.index_select(0, kept)
            keys = rotate(keys, cos, signed_sin)
            attended = attend(query, keys, values) if kept is None else attend(query, keys, values, kept)
            hidden = hidden + attention.o_proj(attended)
            x = post_attention_norm(hidden)
            hidden = hidden + mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        hidden = self.final_norm(hidden)
        if rows is None or keep is not None:
            return self.lm_head(hidden)
        return self.lm_head(hidden.view(*rows, -1)).flatten(0, 1)

    @torch.no_grad()
    def matches_forward(self) -> bool:
        """Whether rows (one right-padded), packed rows and a split layout (two rows continuing one prefix) give the
        forward's logits."""
        device = next(self.model.parameters()).device
        vocab = self.body.embed_tokens.num_embeddings
        rows = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 7, 8, 9]], device=device) % vocab
        expected = self.model(input_ids=rows, use_cache=False).logits
        steps = torch.arange(6, device=device)
        causal = (steps[None, :] <= steps[:, None]).expand(2, 1, 6, 6)
        packed = self.packed(rows, steps.expand(2, 6), causal).view(2, 6, -1)
        attention = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], device=device)
        padded = self.model(input_ids=rows * attention, attention_mask=attention, use_cache=False).logits
        lean_rows = self.rows(rows * attention).view(2, 6, -1)
        if not close_enough(padded[1, :4].float(), lean_rows[1, :4].float()):
            return False
        split = self.split(
            rows[:1, :3],
            rows[:, 3:],
            steps[3:].expand(2, 3),
            torch.zeros(2, dtype=torch.long, device=device),
            torch.ones((2, 3), dtype=torch.bool, device=device),
        )
        split_rows = torch.cat([split[:3].expand(2, 3, -1), split[3:].view(2, 3, -1)], dim=1)
        return close_enough(expected.float(), packed.float()) and close_enough(expected.float(), split_rows.float())


def _sequences(flat: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """(count x length, heads, dim) -> (count, heads, length, dim)."""
    return flat.view(count, length, *flat.shape[1:]).transpose(1, 2)


def _flat(out: torch.Tensor) -> torch.Tensor:
    """(count, heads, length, dim) -> (count x length, heads x dim)."""
    count, heads, length, dim = out.shape
    return out.transpose(1, 2).reshape(count * length, heads * dim)
