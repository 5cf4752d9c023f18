"""A micro-batch's logits at the positions that predict its rows' tokens, and the per-token values the loss reads."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class TokenLogits:
    """`flat` (positions, vocab) logits and `index` (rows, T) long: row r's logits predicting its token t+1 are
    `flat[index[r, t]]`.

    Whole rows give every row position its own flat position; shared prefixes (agentrl/trainer/shared_prefix.py) one
    flat position to a prefix position of all the rows that continue it. The log-softmax of flat / temperature is taken
    once, for the log-probs and the entropy alike; each value is computed per flat position and read out per row, so
    backward sums a shared position's gradient over its rows.
    """

    def __init__(self, flat: torch.Tensor, index: torch.Tensor, temperature: float):
        self.scaled = flat.float() / temperature
        self.index = index
        self.log_probs = F.log_softmax(self.scaled, dim=-1)

    def logprobs(self, targets: torch.Tensor) -> torch.Tensor:
        """(rows, T): log softmax(logits / temperature) at `targets` (rows, T)."""
        vocab = self.log_probs.shape[-1]
        return self.log_probs.reshape(-1)[self.index * vocab + targets]

    def entropy(self) -> torch.Tensor:
        """(rows, T): the entropy of softmax(logits / temperature)."""
        per_position = -(self.log_probs.exp() * self.log_probs).sum(-1)
        return per_position[self.index]

    def uniform_kl(self) -> torch.Tensor:
        """(rows, T): KL(uniform || softmax(logits / temperature)) = logsumexp - mean logit - log V (of the scaled)."""
        scaled = self.scaled
        per_position = torch.logsumexp(scaled, dim=-1) - scaled.mean(-1) - math.log(scaled.shape[-1])
        return per_position[self.index]


def kept_positions(index: torch.Tensor, wanted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat positions the `wanted` row positions read (sorted, at least one), and `index` (rows, T) remapped to
    them: where a forward computed only those (`LeanForward`'s `keep`), row r's logits at t are its `flat[index[r,
    t]]` still; a position not wanted reads the first kept one's (the loss masks it)."""
    keep = index[wanted].unique()
    if keep.numel() == 0:  # nothing trained in this micro-batch: one position keeps the shapes
        keep = index.new_zeros(1)
    kept_at = index.new_zeros(int(index.max()) + 1)
    kept_at[keep] = torch.arange(keep.numel(), device=index.device)
    return keep, kept_at[index]
