"""A micro-batch's logits with each group's shared token prefix forwarded once (`trainer.shared_prefix`).

The episodes of a GRPO group start with the same tokens (the prompt; in multi-turn episodes, at least the first
prompt). `plan` finds each group's longest common prefix among the micro-batch's rows and which packed sequence each
row's rest goes to; `pack` lays each sequence out, the prefix's tokens then its rows' rests, with position ids that
continue each rest from its row's split and a 4D attention mask (a rest attends to its prefix up to its split and
causally to itself, never to another row's rest); `position_logits` forwards that in one call and says where each
row's logits are in it. A position of the prefix stands for every row that continues it, so backward sums its
gradient over those rows: the same logits, loss and gradients as whole rows, up to float rounding.

A prefix's rows may fill several sequences, each starting with the prefix, so that a long group does not make one
long sequence (attention grows with its square) nor pad the others. A plan is taken only when it costs less than whole
rows (`plan`): groups of one, or prefixes a token long, fall back to whole rows.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from agentrl.config import ConfigError

MASKED_ATTENTION = ("sdpa", "eager")  # attention implementations that apply a custom 4D mask as given


@dataclass(frozen=True)
class PrefixPlan:
    """Which prefix each row continues, where each row splits into prefix and rest, and which packed sequence holds
    its rest (a prefix's rows may fill several, each starting with the prefix)."""

    owner: np.ndarray  # (rows,) the prefix each row continues
    split: np.ndarray  # (rows,) tokens of the row inside its prefix (>= 1, < the row's length)
    leader: np.ndarray  # (prefixes,) a row that holds each prefix's tokens
    positions: int  # positions forwarded: packed sequences x the longest of them
    whole_positions: int  # rows x the longest row: what whole rows forward
    sequence: np.ndarray | None = None  # (rows,) the packed sequence of each row's rest; None: one per prefix


@dataclass(frozen=True)
class Packing:
    """A plan's rows as packed sequences, each a prefix then some of its rows' rests (numpy, host side);
    `position_logits` forwards it."""

    ids: np.ndarray  # (sequences, packed) a prefix's tokens, then the rests of the sequence's rows; 0 after
    position_ids: np.ndarray  # (sequences, packed) each token's position in its own row; 0 on padding
    allowed: np.ndarray  # (sequences, packed, packed) bool: the keys each query attends to
    index: np.ndarray  # (rows, longest) position t of row r is flat position index[r, t] of (sequences x packed)


def check_model(model: torch.nn.Module) -> None:
    """Refuse, naming the fix, a model whose forward cannot take the packed rows' 4D mask and position ids."""
    base = _unwrapped(model)
    taken = inspect.signature(base.forward).parameters
    missing = [name for name in ("position_ids", "attention_mask") if name not in taken]
    config = getattr(base, "config", None)
    windowed = [kind for kind in getattr(config, "layer_types", None) or [] if kind != "full_attention"]
    attention = getattr(config, "_attn_implementation", None)
    if missing or windowed or attention not in MASKED_ATTENTION:
        if missing:
            why = f"its forward takes no {', '.join(missing)}"
        elif windowed:
            why = f"it has {sorted(set(windowed))} layers, whose window a custom mask would override"
        else:
            why = f"its attention implementation {attention!r} does not apply a custom 4D mask (sdpa and eager do)"
        raise ConfigError(
            f"trainer.shared_prefix=true forwards each group's prefix and its rows' rests as one sequence with a 4D "
            f"attention mask, which {type(base).__name__} cannot take here ({why}); set trainer.shared_prefix=false"
        )


def pair_cost(model: torch.nn.Module) -> float:
    """What an attention pair costs over a position, for `plan`: a pair's 2 x hidden multiply-adds per layer (x 2.5:
    a masked attention is that much slower than a matmul; measured on CPU, hidden 64) against a position's
    4 x hidden^2 + 3 x hidden x intermediate."""
    config = _unwrapped(model).config
    hidden = config.hidden_size
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    return 2.5 * 2 * hidden / (4 * hidden * hidden + 3 * hidden * intermediate)


def plan(ids: np.ndarray, lengths: np.ndarray, groups: np.ndarray, pair_cost: float = 0.0) -> PrefixPlan | None:
    """The rows' split into shared prefixes and packed sequences (None: whole rows cost less).

    ids: (rows, longest) right-padded token ids; lengths: (rows,); groups: (rows,) group ids. Rows of a group share
    its longest common prefix, cut so that every row keeps at least one token after it. A group's rows go to packed
    sequences of at most `per` rows each (the prefix, then their rests), dealt longest rest first, round robin; `per`
    is the one that costs least, a sequence of length L costing L positions plus L^2 attention pairs x `pair_cost`
    (the model's cost of a pair over that of a position), against whole rows' rows x (longest + longest^2 x
    pair_cost).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = len(lengths)
    keys, owner = np.unique(np.asarray(groups), return_inverse=True)
    owner = owner.reshape(-1)
    prefixes = len(keys)
    members = np.bincount(owner, minlength=prefixes)
    first = np.cumsum(members) - members  # each prefix's first row in `order`
    order = np.lexsort((lengths, owner))
    leader = order[first]  # each prefix's shortest row
    shortest = lengths[leader]
    columns = np.arange(ids.shape[1])
    differs = (ids != ids[leader[owner]]) | (columns >= shortest[owner][:, None])
    agree = np.where(
        differs.any(axis=1), differs.argmax(axis=1), ids.shape[1]
    )  # tokens each row shares with its leader
    common = shortest - 1  # a row keeps a token after its prefix
    np.minimum.at(common, owner, agree)
    if common.min() < 1:
        return None
    longest = int(lengths.max())
    best, best_cost = None, rows * (longest + longest * longest * pair_cost)
    split = common[owner]
    rest = lengths - split
    by_rest = np.lexsort((-rest, owner))  # within a prefix, longest rest first
    rank = np.empty(rows, dtype=np.int64)
    rank[by_rest] = np.arange(rows) - first[owner[by_rest]]
    tried = set()
    for per in range(2, int(members.max()) + 1):
        count = -(-members // per)  # sequences of each prefix
        if count.tobytes() in tried:
            continue
        tried.add(count.tobytes())
        sequence = (np.cumsum(count) - count)[owner] + rank % count[owner]
        sequences = int(count.sum())
        width = int((np.bincount(sequence, weights=rest, minlength=sequences) + np.repeat(common, count)).max())
        cost = sequences * (width + width * width * pair_cost)
        if cost < best_cost:
            best, best_cost = (sequence, sequences * width), cost
    if best is None:
        return None
    return PrefixPlan(owner, split, leader, best[1], rows * longest, best[0])


def pack(ids: np.ndarray, lengths: np.ndarray, prefix_plan: PrefixPlan) -> Packing:
    """The plan's sequences, right-padded: each its prefix's tokens, then the rests of its rows (see the module).

    Rows of a prefix may split at different lengths: a rest attends to its prefix's first `split` positions only.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    split = np.asarray(prefix_plan.split, dtype=np.int64)
    sequence = prefix_plan.owner if prefix_plan.sequence is None else prefix_plan.sequence
    rows, sequences = len(lengths), int(sequence.max()) + 1
    holder = np.empty(sequences, dtype=np.int64)  # a row of each sequence's prefix
    holder[sequence] = prefix_plan.leader[prefix_plan.owner]
    head = np.zeros(sequences, dtype=np.int64)
    np.maximum.at(head, sequence, split)
    rest = lengths - split
    order = np.argsort(sequence, kind="stable")
    before = np.cumsum(rest[order]) - rest[order]  # rests of earlier rows, over all sequences in order
    first = np.searchsorted(sequence[order], np.arange(sequences))
    start = np.empty(rows, dtype=np.int64)
    start[order] = head[sequence[order]] + before - before[first][sequence[order]]
    packed = int((head + np.bincount(sequence, weights=rest, minlength=sequences).astype(np.int64)).max())

    columns = np.arange(packed)
    packed_ids = np.zeros((sequences, packed), dtype=ids.dtype)
    position_ids = np.zeros((sequences, packed), dtype=np.int64)
    segment = np.full((sequences, packed), -2, dtype=np.int64)  # -1: the prefix; r: row r's rest; -2: padding
    sees = np.zeros((sequences, packed), dtype=np.int64)  # a query attends to the prefix's positions below this
    in_prefix = columns[: head.max()] < head[:, None]
    packed_ids[:, : head.max()][in_prefix] = ids[holder, : head.max()][in_prefix]
    position_ids[:, : head.max()] = np.where(in_prefix, columns[: head.max()], 0)
    segment[:, : head.max()][in_prefix] = -1
    sees[:, : head.max()][in_prefix] = packed

    steps = np.arange(rest.max())
    inside = steps < rest[:, None]
    row_of = np.broadcast_to(np.arange(rows)[:, None], inside.shape)[inside]
    to = (sequence[:, None], start[:, None] + steps)
    to = (np.broadcast_to(to[0], inside.shape)[inside], to[1][inside])
    source = (split[:, None] + steps)[inside]
    packed_ids[to] = ids[row_of, source]
    position_ids[to] = source
    segment[to] = row_of
    sees[to] = split[row_of]

    causal = columns[None, :] <= columns[:, None]
    same = segment[:, :, None] == segment[:, None, :]
    prefix_key = (segment[:, None, :] == -1) & (columns[None, None, :] < sees[:, :, None])
    allowed = causal & (same | prefix_key)

    position = np.arange(ids.shape[1])
    within = np.minimum(position, lengths[:, None] - 1)  # past a row's end: its last token's (masked in the loss)
    index = sequence[:, None] * packed + np.where(
        within < split[:, None], within, start[:, None] + within - split[:, None]
    )
    return Packing(packed_ids, position_ids, allowed, index)


def position_logits(model, packing: Packing, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, vocab) logits of the packed rows, and (rows, longest) long: where each row position's logits are.

    One forward of `pack`'s sequences: `flat[index[r, t]]` is what a whole-row forward gives at row r, position t
    (past a row's length, its last token's).
    """
    allowed = torch.from_numpy(packing.allowed)[:, None].to(device)
    if getattr(_unwrapped(model).config, "_attn_implementation", None) == "eager":  # adds the mask to the scores
        dtype = next(model.parameters()).dtype
        allowed = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    out = model(
        input_ids=torch.from_numpy(packing.ids).to(device),
        attention_mask=allowed,
        position_ids=torch.from_numpy(packing.position_ids).to(device),
        use_cache=False,
    ).logits
    return out.reshape(-1, out.shape[-1]), torch.from_numpy(packing.index).to(device)


def logits(model, ids: torch.Tensor, lengths: np.ndarray, prefix_plan: PrefixPlan) -> torch.Tensor:
    """(rows, longest, vocab) logits of right-padded `ids`, each prefix forwarded once (see the module).

    Positions past a row's length hold its last token's logits (whole rows hold padding's there); the loss masks them
    either way.
    """
    flat, index = position_logits(model, pack(ids.cpu().numpy(), lengths, prefix_plan), ids.device)
    return flat[index]


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model itself: PEFT's wrapper passes its keyword arguments on to it."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model
