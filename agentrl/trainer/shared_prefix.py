"""A micro-batch's logits with each group's shared token prefix forwarded once (`trainer.shared_prefix`).

The episodes of a GRPO group start with the same tokens (the prompt; in multi-turn episodes, at least the first
prompt). `plan` finds each group's longest common prefix among the micro-batch's rows and chooses how much of it to
share; `logits` forwards the prefixes once, then every row's rest on its prefix's KV cache, expanded to the rows
with an index (so backward sums each prefix's gradient over its rows), and puts the two parts' logits back in row
order: the same (rows, longest, vocab) tensor a whole-row forward gives, up to float rounding.

A plan is taken only when it forwards fewer positions than whole rows (prefix rows x the longest prefix plus
rows x the longest rest, against rows x the longest row): groups of one, or prefixes a token long, fall back to
whole rows.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from agentrl.config import ConfigError
from agentrl.engine.hf import cache_keyword


@dataclass(frozen=True)
class PrefixPlan:
    """Which prefix each row continues, and where each row splits into prefix and rest."""

    owner: np.ndarray  # (rows,) the prefix row each row continues
    split: np.ndarray  # (rows,) tokens of the row inside its prefix (>= 1, < the row's length)
    leader: np.ndarray  # (prefixes,) a row that holds each prefix's tokens
    positions: int  # positions forwarded: prefixes x the longest prefix + rows x the longest rest
    whole_positions: int  # rows x the longest row: what whole rows forward


def check_model(model: torch.nn.Module) -> None:
    """Refuse, naming the fix, a model whose forward cannot continue rows on an expanded KV cache."""
    base = _unwrapped(model)
    taken = inspect.signature(base.forward).parameters
    missing = [name for name in (cache_keyword(base), "position_ids", "attention_mask") if name not in taken]
    config = getattr(base, "config", None)
    windowed = [kind for kind in getattr(config, "layer_types", None) or [] if kind != "full_attention"]
    if missing or windowed:
        why = f"its forward takes no {', '.join(missing)}" if missing else f"it has {sorted(set(windowed))} layers"
        raise ConfigError(
            f"trainer.shared_prefix=true continues each row on its prefix's KV cache, which {type(base).__name__} "
            f"cannot do here ({why}, whose cache is not per row); set trainer.shared_prefix=false"
        )


def plan(ids: np.ndarray, lengths: np.ndarray, groups: np.ndarray) -> PrefixPlan | None:
    """The rows' split into shared prefixes (None: whole rows forward fewer positions).

    ids: (rows, longest) right-padded token ids; lengths: (rows,); groups: (rows,) group ids. Rows of a group share
    its longest common prefix, cut so that every row keeps at least one token after it. Each group's prefix may be
    shortened (any prefix of a shared prefix is shared): the cut is the one of the groups' own lengths, or none,
    that forwards the fewest positions.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    groups = np.asarray(groups)
    rows = len(lengths)
    keys, owner = np.unique(groups, return_inverse=True)
    common = np.empty(len(keys), dtype=np.int64)
    leader = np.empty(len(keys), dtype=np.int64)
    for prefix in range(len(keys)):
        members = np.flatnonzero(owner == prefix)
        shortest = int(lengths[members].min())
        block = ids[members, :shortest]
        differs = (block != block[0]).any(axis=0)
        same = int(np.argmax(differs)) if differs.any() else shortest
        common[prefix] = min(same, shortest - 1)
        leader[prefix] = members[0]
    if common.min() < 1:
        return None
    whole = rows * int(lengths.max())
    best_cut, best = None, whole
    for cut in np.unique(common):
        split = np.minimum(common, cut)[owner]
        positions = len(keys) * int(cut) + rows * int((lengths - split).max())
        if positions < best:
            best_cut, best = int(cut), positions
    if best_cut is None:
        return None
    return PrefixPlan(owner, np.minimum(common, best_cut)[owner], leader, best, whole)


def logits(model, ids: torch.Tensor, lengths: np.ndarray, prefix_plan: PrefixPlan) -> torch.Tensor:
    """(rows, longest, vocab) float logits of right-padded `ids`, each prefix forwarded once (see the module).

    Positions past a row's length hold some other position's logits (whole rows hold padding's there); the loss
    masks them either way.
    """
    device = ids.device
    lengths = torch.as_tensor(np.asarray(lengths), dtype=torch.long, device=device)
    owner = torch.as_tensor(prefix_plan.owner, dtype=torch.long, device=device)
    split = torch.as_tensor(prefix_plan.split, dtype=torch.long, device=device)
    leader = torch.as_tensor(prefix_plan.leader, dtype=torch.long, device=device)
    rows, longest = ids.shape
    prefixes = len(leader)
    longest_split = np.zeros(prefixes, dtype=np.int64)
    np.maximum.at(longest_split, prefix_plan.owner, prefix_plan.split)  # a group's rows split alike
    prefix_len = torch.as_tensor(longest_split, device=device)
    head = int(prefix_len.max())
    tail = int((lengths - split).max())

    columns = torch.arange(head, device=device)
    prefix_attention = (columns < prefix_len[:, None]).long()
    prefix_ids = ids[leader, :head] * prefix_attention
    out = model(input_ids=prefix_ids, attention_mask=prefix_attention, use_cache=True)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None:
        raise ConfigError(
            f"trainer.shared_prefix=true needs the model's KV cache, and {type(model).__name__} returned none "
            "(activation checkpointing turns it off); set trainer.shared_prefix=false"
        )
    cache.reorder_cache(owner)  # an index_select per layer: backward sums each prefix's gradient over its rows

    steps = torch.arange(tail, device=device)
    inside = steps < (lengths - split)[:, None]
    source = (split[:, None] + steps).clamp(max=longest - 1)
    rest_ids = ids.gather(1, source) * inside
    attention = torch.cat([prefix_attention[owner], inside.long()], dim=1)
    rest = model(
        input_ids=rest_ids,
        attention_mask=attention,
        position_ids=split[:, None] + steps,
        use_cache=True,
        **{cache_keyword(_unwrapped(model)): cache},
    ).logits

    vocab = rest.shape[-1]
    flat = torch.cat([out.logits.reshape(-1, vocab), rest.reshape(-1, vocab)])
    position = torch.arange(longest, device=device)
    in_prefix = position < split[:, None]
    from_prefix = owner[:, None] * head + position
    from_rest = prefixes * head + torch.arange(rows, device=device)[:, None] * tail + (position - split[:, None])
    index = torch.where(in_prefix, from_prefix, from_rest.clamp(0, flat.shape[0] - 1))
    return flat.index_select(0, index.reshape(-1)).view(rows, longest, vocab)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model itself: PEFT's wrapper passes its keyword arguments on to it."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
