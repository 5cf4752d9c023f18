"""A step's scalars go to TensorBoard as one event, and read back as the one-event-per-scalar writer's did: every tag,
step and value (NaN and infinities too), and a resumed run's purge of the steps it redoes."""

from __future__ import annotations

import math

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from agentrl.tracking.tensorboard import TensorBoardTracker
from tests.mpi.helpers import scalars

STEPS = [
    {"episode/success_rate": 0.25, "train/loss": -0.125, "perf/tokens_per_s": 12345.678, "run/restarts": 0},
    {"episode/success_rate": 0.375, "train/lr": np.float32(5e-3), "train/tokens": np.int64(7)},
    {"episode/success_rate": 0.5, "train/loss": float("nan"), "perf/tokens_per_s": float("inf")},
    {"episode/success_rate": 1.0, "train/loss": 3e38, "eval/pass@4": -float("inf")},
]


def same(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return len(a) == len(b) and all(
        sa == sb and (va == vb or (math.isnan(va) and math.isnan(vb))) for (sa, va), (sb, vb) in zip(a, b, strict=True)
    )


def test_one_event_per_step_reads_back_as_add_scalar_wrote_it(tmp_path):
    tracker = TensorBoardTracker(tmp_path / "ours", 0)
    reference = SummaryWriter(str(tmp_path / "theirs" / "tb"))
    for step, values in enumerate(STEPS):
        tracker.log_scalars(step, values)
        for key, value in values.items():
            reference.add_scalar(key, value, step)
    tracker.close()
    reference.close()
    ours, theirs = scalars(tmp_path / "ours"), scalars(tmp_path / "theirs")
    assert set(ours) == set(theirs) == {key for values in STEPS for key in values}
    for tag in theirs:
        assert same(ours[tag], theirs[tag]), (tag, ours[tag], theirs[tag])
    assert ours["train/loss"][0] == (0, -0.125) and math.isnan(ours["train/loss"][1][1])


def test_a_resumed_run_shows_each_step_once(tmp_path):
    first = TensorBoardTracker(tmp_path, 0)
    for step in range(4):
        first.log_scalars(step, {"episode/success_rate": float(step)})
    first.close()
    resumed = TensorBoardTracker(tmp_path, 2)  # steps 2 and 3 are redone
    for step in range(2, 5):
        resumed.log_scalars(step, {"episode/success_rate": 10.0 + step})
    resumed.close()
    assert scalars(tmp_path)["episode/success_rate"] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0), (4, 14.0)]


def test_the_numpy_checksum_is_tensorboards_for_every_length():
    """Records of every length up to past the table's end (4 KiB) and the standard check value: the same masked
    CRC-32C as TensorBoard's own, so its reader (which checks them) reads the files."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboards

    from agentrl.tracking.event_crc import MAX_TABLE_BYTES, crc32c, masked_crc32c

    assert crc32c(b"123456789") == 0xE3069283
    rng = np.random.default_rng(0)
    lengths = [*range(0, 80), *rng.integers(80, MAX_TABLE_BYTES, 40), MAX_TABLE_BYTES, MAX_TABLE_BYTES + 1, 9000]
    for length in lengths:
        data = rng.integers(0, 256, int(length), dtype=np.uint8).tobytes()
        assert masked_crc32c(data) == tensorboards(data), length
