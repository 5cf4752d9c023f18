"""Rows of one prefill that hold the same tokens (a GRPO group's copies of a prompt): each distinct prompt is
prefilled once, and its KV cache and last logits are copied to every row that has it.

A prefill's cost grows with its rows x tokens, and a small model on CPU is compute-bound: 8 prompts x 8 copies of 14
tokens cost 8x what the 8 distinct prompts do. Sampling stays per row: each copy draws its own tokens from the
logits its prompt gave.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


class SharedPrompts:
    """Which rows of a prefill are prefilled (`leaders`, in row order) and which leader each row copies."""

    def __init__(self, leaders: list[int], copies: list[int]):
        self.leaders = leaders  # rows prefilled
        self.copies = copies  # per row: the index among `leaders` of the row whose prefill it takes

    @classmethod
    def of(cls, keys: Sequence[Hashable], rank: Sequence[int] | None = None) -> SharedPrompts | None:
        """Rows of equal `keys` share one prefill; None when every key differs. `rank`, if given, picks each group's
        leader: the row of the highest rank (the first one on a tie), e.g. the one with the longest kept KV."""
        group_of: dict[Hashable, int] = {}
        members: list[list[int]] = []
        groups = []
        for row, key in enumerate(keys):
            group = group_of.setdefault(key, len(members))
            if group == len(members):
                members.append([])
            members[group].append(row)
            groups.append(group)
        if len(members) == len(groups):
            return None
        heads = [max(rows, key=lambda row: rank[row]) if rank is not None else rows[0] for rows in members]
        order = sorted(range(len(heads)), key=heads.__getitem__)  # leaders in row order
        place = {group: index for index, group in enumerate(order)}
        return cls([heads[group] for group in order], [place[group] for group in groups])

    def copy_index(self, device: torch.device) -> torch.Tensor:
        """`copies` as a tensor: indexing the leaders' tensors with it gives every row's."""
        return torch.tensor(self.copies, dtype=torch.long, device=device)

    def leader_index(self, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.leaders, dtype=torch.long, device=device)

    def followers(self) -> list[tuple[int, int]]:
        """(row, leader row) of every row that takes another row's prefill."""
        return [(row, self.leaders[index]) for row, index in enumerate(self.copies) if self.leaders[index] != row]
