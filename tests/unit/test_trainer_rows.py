"""The trainer's micro-batch rows (one numpy gather for all episodes) hold what slicing each episode out of the flat
batch gives: the same values in every dtype the trainer reads, zeros after each episode, ones in its attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.trainer.policy_trainer import _gather_rows, _rows
from agentrl.trajectory import Episode, pack


def row_by_row(flat, offsets, episodes, dtype) -> torch.Tensor:
    """The plain way: one slice per episode."""
    lengths = [int(offsets[i + 1] - offsets[i]) for i in episodes]
    out = torch.zeros(len(episodes), max(lengths), dtype=dtype)
    for row, i in enumerate(episodes):
        out[row, : lengths[row]] = torch.from_numpy(np.asarray(flat[offsets[i] : offsets[i + 1]])).to(dtype)
    return out


@pytest.fixture
def batch():
    rng = np.random.default_rng(7)
    episodes = []
    for index, length in enumerate([5, 1, 9, 3, 9, 2]):
        episode = Episode(group=index // 2, task_seed=index)
        episode.extend(rng.integers(0, 50_000, size=length), mask=int(index % 2), logprobs=rng.normal(size=length))
        episodes.append(episode)
    return pack(episodes)


@pytest.mark.parametrize("episodes", [[0, 1, 2, 3, 4, 5], [4, 1], [3], [5, 0, 2]])
def test_rows_match_slicing_each_episode(batch, episodes):
    offsets = batch["offsets"]
    advantages = np.random.default_rng(1).normal(size=len(batch["tokens"]))  # float64, as the algorithms give
    for flat, dtype in [
        (batch["tokens"], torch.long),
        (batch["loss_mask"], torch.float32),
        (batch["logprobs"], torch.float32),
        (advantages, torch.float32),
    ]:
        lengths = [int(offsets[i + 1] - offsets[i]) for i in episodes]
        got = _gather_rows(flat, offsets, episodes, lengths, dtype)
        want = row_by_row(flat, offsets, episodes, dtype)
        assert got.dtype == dtype and torch.equal(got, want)
    ids, attention, lengths = _rows(batch, np.array(episodes), "tokens", torch.long)
    assert torch.equal(ids, row_by_row(batch["tokens"], offsets, episodes, torch.long))
    assert attention.dtype == torch.long
    assert attention.sum(dim=1).tolist() == lengths
    for row, length in enumerate(lengths):
        assert attention[row, :length].eq(1).all() and attention[row, length:].eq(0).all()
