"""A group's rows as one token tree: every prefix any two rows share forwarded once (`trainer.shared_prefix`).

A group's episodes share more than their prompt: in a multi-turn episode, rows that made the same first move get the
same reply and go on alike until they differ. `grow` puts each group's rows in a prefix tree (a node per distinct
prefix, in the order a depth-first walk meets them, so a node's ancestors come before it) and `pack` lays each tree
out as one sequence: a node's position id is its depth, and it attends to its ancestors and itself only. A node
stands for every row through it, so backward sums its gradient over them, as for the one shared prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PrefixTree:
    """Each row position's node in its group's tree."""

    node: np.ndarray  # (rows, longest) node of row r's first t+1 tokens in tree owner[r]; past a row: its last
    owner: np.ndarray  # (rows,) the tree (group) of each row
    nodes: np.ndarray  # (trees,) nodes in each tree

    @property
    def positions(self) -> int:
        """What one forward of the trees, each padded to the largest, computes."""
        return len(self.nodes) * int(self.nodes.max())


def grow(ids: np.ndarray, lengths: np.ndarray, owner: np.ndarray) -> PrefixTree:
    """The trees of right-padded `ids` (rows, longest), rows of equal `owner` (0..trees-1) in one tree."""
    owner = np.asarray(owner, dtype=np.int64)
    order, fresh = walk(ids, lengths, owner)
    return _grown(order, fresh, np.asarray(lengths, dtype=np.int64), owner, ids.shape[1])


def _grown(order: np.ndarray, fresh: np.ndarray, lengths: np.ndarray, owner: np.ndarray, longest: int) -> PrefixTree:
    """The trees of a walk (`walk`'s order and shared counts; `fresh` 0 where a tree starts)."""
    rows = len(order)
    columns = np.arange(longest)
    new = lengths[order] - fresh  # nodes each walked row adds
    tree = owner[order]
    nodes = np.bincount(tree, weights=new, minlength=int(owner.max()) + 1).astype(np.int64)
    before = np.cumsum(new) - new  # nodes added before each walked row, over all trees
    base = before - (np.cumsum(nodes) - nodes)[tree]  # ... within its own tree
    # position t of walked row i is the node added by the last row j <= i of its tree with fresh[j] <= t
    added = np.where(fresh[:, None] <= columns, np.arange(rows)[:, None], -1)
    by = np.maximum.accumulate(added, axis=0)
    within = np.minimum(columns, lengths[order][:, None] - 1)
    by = by[np.arange(rows)[:, None], within]
    walked_node = base[by] + within - fresh[by]
    node = np.empty_like(walked_node)
    node[order] = walked_node
    return PrefixTree(node, owner, nodes)


def walk(ids: np.ndarray, lengths: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows in depth-first order (by owner, then by tokens), and how many leading tokens each shares with the row
    walked before it (0 for an owner's first row)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    owner = np.asarray(owner, dtype=np.int64)
    padded = np.where(np.arange(ids.shape[1]) < lengths[:, None], ids, -1)  # a shorter row sorts before those it begins
    order = np.lexsort(np.vstack([padded.T[::-1], owner[None]]))
    walked = padded[order]
    differs = walked[1:] != walked[:-1]
    shared = np.where(differs.any(axis=1), differs.argmax(axis=1), ids.shape[1])
    fresh = np.concatenate([[0], np.minimum(shared, lengths[order[1:]])])
    fresh[np.flatnonzero(np.diff(owner[order]) != 0) + 1] = 0
    return order, fresh


def fit(
    ids: np.ndarray, lengths: np.ndarray, owner: np.ndarray, pair_cost: float, bound: float = math.inf
) -> tuple[PrefixTree | None, float]:
    """The cheapest trees of width W, for W from the longest row up to the largest group's tree: each group's walk cut
    into runs of at most W nodes (a run's tree repeats what its rows share with earlier runs), the runs' trees
    packed first-fit, largest first, into sequences of W (attending only within their own tree). A sequence of N
    positions costs N + N^2 x pair_cost. Returns the trees and their cost; (None, inf) where no width could cost
    `bound` or less: the sequences hold every node at least once, each as long as the longest row at least."""
    lengths = np.asarray(lengths, dtype=np.int64)
    owner = np.asarray(owner, dtype=np.int64)
    order, fresh = walk(ids, lengths, owner)
    if int(lengths.sum() - fresh.sum()) * (1 + int(lengths.max()) * pair_cost) > bound:
        return None, math.inf
    walked_lengths = lengths[order].tolist()
    new = (lengths[order] - fresh).tolist()
    walked_owner = owner[order].tolist()
    starts = [i == 0 or walked_owner[i] != walked_owner[i - 1] for i in range(len(order))]
    width, largest = int(lengths.max()), int(np.bincount(walked_owner, weights=new).max())
    best = None
    while True:
        run, runs = np.empty(len(order), dtype=np.int64), []
        for i, (length, added) in enumerate(zip(walked_lengths, new, strict=True)):
            if starts[i] or runs[-1] + added > width:
                runs.append(length)  # a run's first row adds all its tokens
            else:
                runs[-1] += added
            run[i] = len(runs) - 1
        fills: list[int] = []
        sequence = np.empty(len(runs), dtype=np.int64)
        offset = np.empty(len(runs), dtype=np.int64)
        for k in sorted(range(len(runs)), key=lambda k: -runs[k]):
            place = next((j for j, fill in enumerate(fills) if fill + runs[k] <= width), len(fills))
            if place == len(fills):
                fills.append(0)
            sequence[k], offset[k] = place, fills[place]
            fills[place] += runs[k]
        longest = max(fills)
        cost = len(fills) * (longest + longest * longest * pair_cost)
        if best is None or cost < best[0]:
            best = (cost, run, sequence, offset, np.asarray(fills, dtype=np.int64))
        if width >= largest:
            break
        width = min(largest, width * 3 // 2 + 1)
    cost, run, sequence, offset, fills = best
    # the runs' trees from the same walk: a run's rows are consecutive in it, and its first row shares nothing
    run_of = np.empty(len(order), dtype=np.int64)
    run_of[order] = run
    run_fresh = np.where(np.diff(run, prepend=-1) != 0, 0, fresh)
    tree = _grown(order, run_fresh, lengths, run_of, ids.shape[1])
    return PrefixTree(tree.node + offset[run_of][:, None], sequence[run_of], fills), cost


def pack(ids: np.ndarray, lengths: np.ndarray, tree: PrefixTree) -> tuple[np.ndarray, ...]:
    """The trees as the fields of `shared_prefix.Packing` (ids, position ids, mask, index): sequence k holds tree k's
    nodes, right-padded to the largest tree."""
    lengths = np.asarray(lengths, dtype=np.int64)
    longest = ids.shape[1]
    trees, width = len(tree.nodes), int(tree.nodes.max())
    packed_ids = np.zeros((trees, width), dtype=ids.dtype)
    position_ids = np.zeros((trees, width), dtype=np.int64)
    columns = np.arange(longest)
    inside = columns < lengths[:, None]
    sequence = np.broadcast_to(tree.owner[:, None], ids.shape)
    packed_ids[sequence[inside], tree.node[inside]] = ids[inside]
    position_ids[sequence[inside], tree.node[inside]] = np.broadcast_to(columns, ids.shape)[inside]
    allowed = _ancestors(position_ids)
    index = tree.owner[:, None] * width + tree.node
    return packed_ids, position_ids, allowed, index


def _ancestors(depth: np.ndarray) -> np.ndarray:
    """(sequences, width, width) bool: whether node m is node n's ancestor or n itself. A sequence's nodes are
    depth-first walks one after another (padding: depth 0, each its own root), so m's subtree is the nodes from m
    up to the first later node no deeper than m."""
    width = depth.shape[1]
    nodes = np.arange(width)
    after = np.triu(np.ones((width, width), dtype=bool), 1)  # (m, j): j after m
    causal = np.tril(np.ones((width, width), dtype=bool))  # (n, m): m up to n
    allowed = np.empty((len(depth), width, width), dtype=bool)
    later = np.empty((width, width), dtype=bool)
    for k, row in enumerate(depth):  # a sequence at a time: temporaries of one sequence's mask
        np.less_equal(row[None, :], row[:, None], out=later)
        later &= after
        end = later.argmax(axis=1)
        end[~later[nodes, end]] = width  # the subtree runs to the sequence's end
        np.less(nodes[:, None], end[None, :], out=allowed[k])
        allowed[k] &= causal
    return allowed
