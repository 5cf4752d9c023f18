"""A micro-batch's logits with each group's shared token prefix forwarded once (`trainer.shared_prefix`).

The episodes of a GRPO group start with the same tokens (the prompt; in multi-turn episodes, at least the first
prompt). `plan` finds each group's longest common prefix among the micro-batch's rows and lays the rows out in one of
three ways, whichever costs least (and only if that is less than whole rows):

- packed, one forward: `pack` makes sequences of a prefix's tokens followed by the rests of some of its rows, with
  position ids that continue each rest from its row's split and a 4D attention mask (a rest attends to its prefix up
  to its split and causally to itself, never to another row's rest). Cheapest where the prefix is most of a row
  (one-turn tasks): its cost is the packed sequences' length and, squared, their attention, masked pairs included.
- on a KV cache, two forwards: the prefixes, then every row's rest on its prefix's cache, expanded to the rows with an
  index. Cheapest where rests are long (multi-turn episodes after a short prompt), whose attention packing would
  square; it pays a second forward (one pass where the model has a `LeanForward`, agentrl/trainer/lean_forward.py).
- as a tree, one forward: each group's rows as one prefix tree, or all the micro-batch's rows as one
  (agentrl/trainer/prefix_tree.py), every prefix any two rows share computed once, the prompt and beyond it
  (multi-turn rows that made the same moves). Its cost is the trees' nodes and, squared, their attention.

Either way a prefix position stands for every row that continues it, so backward sums its gradient over those rows:
the same logits, loss and gradients as whole rows, up to float rounding. `prepare` turns a plan into what
`position_logits` forwards; it returns the logits at the positions it computed and, per row position, where its
logits are among them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from agentrl.config import ConfigError
from agentrl.engine.hf import cache_keyword
from agentrl.models.adapters import peft_base
from agentrl.trainer import prefix_tree
from agentrl.trainer.lean_forward import LeanForward
from agentrl.trainer.token_logits import kept_positions

MASKED_ATTENTION = ("sdpa", "eager")  # attention implementations that apply a custom 4D mask as given
SECOND_FORWARD_COST = (
    300  # positions: what the cached layout's second forward adds (about 5 ms of the tiny model's CPU)
)


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
    cached: bool = False  # the rests on the prefixes' KV cache (two forwards), not packed
    tree: prefix_tree.PrefixTree | None = None  # each group's rows as one prefix tree (one forward)


@dataclass(frozen=True)
class Packing:
    """A plan's rows as packed sequences, each a prefix then some of its rows' rests (numpy, host side);
    `position_logits` forwards it."""

    ids: np.ndarray  # (sequences, packed) a prefix's tokens, then the rests of the sequence's rows; 0 after
    position_ids: np.ndarray  # (sequences, packed) each token's position in its own row; 0 on padding
    allowed: np.ndarray  # (sequences, packed, packed) bool: the keys each query attends to
    index: np.ndarray  # (rows, longest) position t of row r is flat position index[r, t] of (sequences x packed)


@dataclass(frozen=True)
class CachedRows:
    """A cached plan's rows: each prefix forwarded once, then every row's rest on its prefix's KV cache."""

    prefix_plan: PrefixPlan
    lengths: np.ndarray  # (rows,)


def check_model(model: torch.nn.Module) -> tuple[str, ...]:
    """The layouts `model` can forward ("packed", "tree", "cached"); refuse, naming the fix, a model that can take
    none."""
    base = peft_base(model)
    taken = inspect.signature(base.forward).parameters
    missing = [name for name in ("position_ids", "attention_mask") if name not in taken]
    config = getattr(base, "config", None)
    windowed = [kind for kind in getattr(config, "layer_types", None) or [] if kind != "full_attention"]
    attention = getattr(config, "_attn_implementation", None)
    layouts = tuple(
        name
        for name, able in (
            ("packed", attention in MASKED_ATTENTION),
            ("tree", attention in MASKED_ATTENTION),
            ("cached", cache_keyword(base) in taken),
        )
        if able
    )
    if missing or windowed or not layouts:
        if missing:
            why = f"its forward takes no {', '.join(missing)}"
        elif windowed:
            why = f"it has {sorted(set(windowed))} layers, whose window neither layout keeps"
        else:
            why = f"its attention implementation {attention!r} ignores a custom 4D mask and its forward takes no cache"
        raise ConfigError(
            f"trainer.shared_prefix=true forwards each group's prefix once, packed with its rows' rests under a 4D "
            f"attention mask or as a KV cache they continue, which {type(base).__name__} cannot do here ({why}); "
            "set trainer.shared_prefix=false"
        )
    return layouts


def pair_cost(model: torch.nn.Module) -> float:
    """What an attention pair costs over a position, for `plan`: a pair's 2 x hidden multiply-adds per layer (x 2.5:
    a masked attention is that much slower than a matmul; measured on CPU, hidden 64) against a position's
    4 x hidden^2 + 3 x hidden x intermediate."""
    config = peft_base(model).config
    hidden = config.hidden_size
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    return 2.5 * 2 * hidden / (4 * hidden * hidden + 3 * hidden * intermediate)


def plan(
    ids: np.ndarray,
    lengths: np.ndarray,
    groups: np.ndarray,
    pair_cost: float = 0.0,
    layouts: tuple[str, ...] = ("packed", "tree", "cached"),
) -> PrefixPlan | None:
    """The rows' split into shared prefixes, and their layout (None: whole rows cost least).

    ids: (rows, longest) right-padded token ids; lengths: (rows,); groups: (rows,) group ids. Rows of a group share
    its longest common prefix, cut so that every row keeps at least one token after it. Costs are positions plus
    attention pairs x `pair_cost` (the model's cost of a pair over that of a position); whole rows cost rows x
    (longest + longest^2 x pair_cost).
    - packed: a group's rows go to sequences of at most `per` rows each (the prefix, then their rests), dealt
      longest rest first, round robin; a sequence of length L costs L + L^2 x pair_cost, and `per` is the cheapest.
    - cached: prefixes x the longest prefix H, plus rows x the longest rest R, each rest attending to H + R keys,
      plus SECOND_FORWARD_COST; the prefixes may be cut to one of the groups' own lengths (any prefix of a shared
      prefix is shared), the cheapest cut taken.
    - tree: each group's prefix tree, or one tree of all the rows, cut into runs of its walk and packed into
      sequences (`prefix_tree.fit`); a sequence of length N costs N + N^2 x pair_cost.
    Of equal costs the packed layout is taken, then the tree.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = len(lengths)
    keys, owner = np.unique(np.asarray(groups), return_inverse=True)
    owner = owner.reshape(-1)
    prefixes = len(keys)
    members = np.bincount(owner, minlength=prefixes)
    first = np.cumsum(members) - members  # each prefix's first row, counted in rows sorted by prefix
    leader, common = common_prefixes(ids, lengths, owner)
    shared = common.min() >= 1  # else some group shares no token before a row's last: only the tree can pack it
    longest = int(lengths.max())
    whole = rows * longest
    best, best_cost = None, rows * (longest + longest * longest * pair_cost)
    # a tree per group, and one of all the rows: groups share more where their prompts agree (a game whose secret the
    # prompt does not show: its groups' episodes that guessed and were answered alike are the same tokens)
    tree_owners = ([owner, np.zeros_like(owner)] if prefixes > 1 else [owner]) if "tree" in layouts else []
    # the tree of all the rows is the cheapest most often: fitted first, its cost bounds the others'
    all_rows = prefix_tree.fit(ids, lengths, tree_owners[-1], pair_cost) if tree_owners else None
    bound = best_cost if all_rows is None else min(best_cost, all_rows[1])  # a layout costing more is not laid out
    # packed: the sequences hold every prefix at least once and every rest
    if "packed" in layouts and shared and common.sum() + (lengths - common[owner]).sum() <= bound:
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
                best, best_cost = PrefixPlan(owner, split, leader, sequences * width, whole, sequence), cost
    for tree_owner in tree_owners:
        if tree_owner is tree_owners[-1]:
            tree, cost = all_rows
        else:
            tree, cost = prefix_tree.fit(ids, lengths, tree_owner, pair_cost, min(bound, best_cost))
        if tree is not None and cost < best_cost:
            best, best_cost = PrefixPlan(owner, common[owner], leader, tree.positions, whole, tree=tree), cost
    if "cached" in layouts and shared and SECOND_FORWARD_COST + rows <= bound:  # a tail of a token a row, at least
        for cut in np.unique(common):
            split = np.minimum(common, cut)[owner]
            tail = int((lengths - split).max())
            positions = prefixes * int(cut) + rows * tail
            pairs = prefixes * int(cut) ** 2 + rows * tail * (int(cut) + tail)
            cost = positions + pairs * pair_cost + SECOND_FORWARD_COST
            if cost < best_cost:
                best, best_cost = PrefixPlan(owner, split, leader, positions, whole, cached=True), cost
    return best


def common_prefixes(ids: np.ndarray, lengths: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group (`owner`: each row's group, 0..groups-1): its shortest row (the leader), and how many leading tokens
    all its rows share, cut so that every row keeps at least one token after them."""
    lengths = np.asarray(lengths, dtype=np.int64)
    members = np.bincount(owner)
    order = np.lexsort((lengths, owner))
    leader = order[np.cumsum(members) - members]  # each group's shortest row
    shortest = lengths[leader]
    columns = np.arange(ids.shape[1])
    differs = (ids != ids[leader[owner]]) | (columns >= shortest[owner][:, None])
    agree = np.where(differs.any(axis=1), differs.argmax(axis=1), ids.shape[1])  # tokens shared with the leader
    common = shortest - 1  # a row keeps a token after its prefix
    np.minimum.at(common, owner, agree)
    return leader, common


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
    allowed = np.empty((sequences, packed, packed), dtype=bool)
    prefix_key = np.empty((packed, packed), dtype=bool)
    for k in range(sequences):  # a sequence at a time, in place: temporaries of one sequence's mask
        np.equal(segment[k][:, None], segment[k][None, :], out=allowed[k])
        np.less(columns[None, :], sees[k][:, None], out=prefix_key)
        prefix_key &= segment[k][None, :] == -1
        allowed[k] |= prefix_key
        allowed[k] &= causal

    position = np.arange(ids.shape[1])
    within = np.minimum(position, lengths[:, None] - 1)  # past a row's end: its last token's (masked in the loss)
    index = sequence[:, None] * packed + np.where(
        within < split[:, None], within, start[:, None] + within - split[:, None]
    )
    return Packing(packed_ids, position_ids, allowed, index)


def prepare(ids: np.ndarray, lengths: np.ndarray, prefix_plan: PrefixPlan) -> Packing | CachedRows:
    """What `position_logits` forwards for a plan, made on the host from its right-padded `ids`."""
    if prefix_plan.cached:
        return CachedRows(prefix_plan, np.asarray(lengths, dtype=np.int64))
    if prefix_plan.tree is not None:
        return Packing(*prefix_tree.pack(ids, lengths, prefix_plan.tree))
    return pack(ids, lengths, prefix_plan)


def position_logits(
    model,
    ids: torch.Tensor,
    layout: Packing | CachedRows,
    lean: LeanForward | None = None,
    wanted: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, vocab) logits of the positions forwarded, and (rows, longest) long: where each row position's
    logits are among them (`prepare`'s layout of the right-padded `ids`, on the model's device). `lean`: the
    model's `LeanForward`, if it has one (a cached layout in one pass then); with it, `wanted` (rows, longest) bool
    names the row positions read, and only their logits are computed (`kept_positions`).

    `flat[index[r, t]]` is what a whole-row forward gives at row r, position t; past a row's length (and with
    `wanted`, where not wanted), some other position's (the loss masks them).
    """
    if isinstance(layout, CachedRows):
        return _cached_logits(model, ids, layout, lean, wanted)
    device = ids.device
    allowed = torch.from_numpy(layout.allowed)[:, None].to(device)
    if lean is not None:
        ids, positions = (torch.from_numpy(array).to(device) for array in (layout.ids, layout.position_ids))
        index = torch.from_numpy(layout.index).to(device)
        if wanted is None:
            return lean.packed(ids, positions, allowed), index
        keep, index = kept_positions(index, wanted)
        return lean.packed(ids, positions, allowed, keep), index
    if getattr(peft_base(model).config, "_attn_implementation", None) == "eager":  # adds the mask to the scores
        dtype = next(model.parameters()).dtype
        allowed = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    out = model(
        input_ids=torch.from_numpy(layout.ids).to(device),
        attention_mask=allowed,
        position_ids=torch.from_numpy(layout.position_ids).to(device),
        use_cache=False,
    ).logits
    return out.reshape(-1, out.shape[-1]), torch.from_numpy(layout.index).to(device)


def _cached_logits(
    model, ids: torch.Tensor, layout: CachedRows, lean: LeanForward | None = None, wanted: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefixes forwarded once, then every row's rest on its prefix's KV cache (see the module); with `lean`,
    both in one pass (and with `wanted`, only the logits read there)."""
    prefix_plan = layout.prefix_plan
    device = ids.device
    lengths = torch.as_tensor(layout.lengths, dtype=torch.long, device=device)
    owner = torch.as_tensor(prefix_plan.owner, dtype=torch.long, device=device)
    split = torch.as_tensor(prefix_plan.split, dtype=torch.long, device=device)
    leader = torch.as_tensor(prefix_plan.leader, dtype=torch.long, device=device)
    rows, longest = ids.shape
    prefixes = len(leader)
    longest_split = np.zeros(prefixes, dtype=np.int64)
    np.maximum.at(longest_split, prefix_plan.owner, prefix_plan.split)  # a group's rows split alike
    prefix_len = torch.as_tensor(longest_split, device=device)
    head = int(longest_split.max())
    tail = int((layout.lengths - prefix_plan.split).max())

    columns = torch.arange(head, device=device)
    prefix_attention = (columns < prefix_len[:, None]).long()
    prefix_ids = ids[leader, :head] * prefix_attention
    steps = torch.arange(tail, device=device)
    inside = steps < (lengths - split)[:, None]
    source = (split[:, None] + steps).clamp(max=longest - 1)
    rest_ids = ids.gather(1, source) * inside
    position = torch.arange(longest, device=device)
    from_prefix = owner[:, None] * head + position
    from_rest = prefixes * head + torch.arange(rows, device=device)[:, None] * tail + (position - split[:, None])
    forwarded = prefixes * head + rows * tail
    index = torch.where(position < split[:, None], from_prefix, from_rest.clamp(0, forwarded - 1))
    if lean is None:
        flat = _prefix_then_rests(model, prefix_ids, prefix_attention, rest_ids, inside, owner, split[:, None] + steps)
        return flat, index
    keep = None
    if wanted is not None:
        keep, index = kept_positions(index, wanted)
    return lean.split(prefix_ids, rest_ids, split[:, None] + steps, owner, prefix_attention[owner].bool(), keep), index


def _prefix_then_rests(model, prefix_ids, prefix_attention, rest_ids, inside, owner, rest_positions) -> torch.Tensor:
    """The cached layout's logits by the model's forward: the prefixes, then the rests on their KV cache."""
    out = model(input_ids=prefix_ids, attention_mask=prefix_attention, use_cache=True)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None:
        raise ConfigError(
            f"trainer.shared_prefix=true needs the model's KV cache here, and {type(model).__name__} returned none "
            "(activation checkpointing turns it off); set trainer.shared_prefix=false"
        )
    cache.reorder_cache(owner)  # an index_select per layer: backward sums each prefix's gradient over its rows
    attention = torch.cat([prefix_attention[owner], inside.long()], dim=1)
    rest = model(
        input_ids=rest_ids,
        attention_mask=attention,
        position_ids=rest_positions,
        use_cache=True,
        **{cache_keyword(peft_base(model)): cache},
    ).logits
    vocab = rest.shape[-1]
    return torch.cat([out.logits.reshape(-1, vocab), rest.reshape(-1, vocab)])


def logits(
    model, ids: torch.Tensor, lengths: np.ndarray, prefix_plan: PrefixPlan, lean: LeanForward | None = None
) -> torch.Tensor:
    """(rows, longest, vocab) logits of right-padded `ids`, each prefix forwarded once (see the module).

    Positions past a row's length hold some other position's logits (whole rows hold padding's there); the loss
    masks them either way.
    """
    flat, index = position_logits(model, ids, prepare(ids.cpu().numpy(), lengths, prefix_plan), lean)
    return flat[index]
