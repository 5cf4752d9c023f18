"""The SFT data order: every transcript once per epoch, a new order each epoch, the same order on every rank and
after a resume (a function of seed and step only)."""

import numpy as np

from agentrl.commands.sft import batch_indices, steps_per_epoch
from agentrl.sft.config import SFTConfig


def config(**sft):
    return SFTConfig.model_validate({"model": {"path": "m"}, "sft": {"train": "t.jsonl", "batch_size": 4, **sft}})


def test_each_epoch_covers_every_transcript_once_in_a_new_order():
    cfg = config()
    per_epoch = steps_per_epoch(cfg, 10)
    assert per_epoch == 3  # 4 + 4 + 2
    epochs = [np.concatenate([batch_indices(cfg, 10, e * per_epoch + b) for b in range(per_epoch)]) for e in range(2)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(10))
    assert epochs[0].tolist() != epochs[1].tolist()
    assert [len(batch_indices(cfg, 10, step)) for step in range(3)] == [4, 4, 2]


def test_order_depends_only_on_seed_and_step():
    assert batch_indices(config(), 50, 7).tolist() == batch_indices(config(), 50, 7).tolist()
    other = SFTConfig.model_validate({**config().model_dump(), "seed": 1})
    assert batch_indices(config(), 50, 7).tolist() != batch_indices(other, 50, 7).tolist()
