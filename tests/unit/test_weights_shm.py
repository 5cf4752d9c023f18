"""The shared-memory weight sync's pieces in one process: slot layout, seqlock stamps, the writer's window."""

import pytest
import torch
from mpi4py import MPI

from agentrl.weights.base import spec_nbytes
from agentrl.weights.shm import ALIGN, SharedMemoryWeights, SharedWindow, TornWeights, plan_layout


def test_every_tensor_starts_aligned_and_buckets_fit_their_slot():
    manifest = [
        ("a", (3,), "float32"),  # 12 bytes
        ("b", (5, 7), "bfloat16"),  # 70 bytes: the next tensor would start misaligned without padding
        ("c", (1000,), "float32"),
        ("d", (2, 3), "int64"),
        ("big", (10_000,), "float32"),  # larger than a bucket: alone in its own
    ]
    buckets, offsets, capacity = plan_layout(manifest, bucket_bytes=4096)
    assert buckets == [(0, 2), (2, 4), (4, 5)]  # padded: 64 + 128, 4032 + 64, 40000
    for start, end in buckets:
        assert offsets[start] == 0
        for index in range(start, end):
            assert offsets[index] % ALIGN == 0
            assert offsets[index] + spec_nbytes(manifest[index]) <= capacity
            if index > start:  # no overlap with the previous tensor of the bucket
                assert offsets[index] >= offsets[index - 1] + spec_nbytes(manifest[index - 1])
    assert capacity == 40_000


def test_a_reader_refuses_a_slot_being_written_or_rewritten():
    window = SharedWindow(MPI.COMM_SELF, slots=2, capacity=256)
    try:
        slot = window.slots[1]
        slot.begin_write()
        with pytest.raises(TornWeights, match="being written"):
            slot.check(version=3, bucket=1)
        slot.end_write(version=3, bucket=1)
        seen = slot.check(version=3, bucket=1)
        with pytest.raises(TornWeights, match="expected bucket 1 of version 4"):
            slot.check(version=4, bucket=1)  # still the old version
        slot.begin_write()
        slot.end_write(version=3, bucket=1)  # rewritten with the same stamp while a reader was copying
        with pytest.raises(TornWeights, match=f"unchanged since sequence {seen}"):
            slot.check(version=3, bucket=1, seen=seen)
        assert window.slots[0].check(version=0, bucket=0) == 0  # slots are independent
    finally:
        window.free()


def test_the_writer_fills_its_window_and_grows_it_for_a_larger_model():
    sync = SharedMemoryWeights(MPI.COMM_SELF, node=0, bucket_mb=1.0)  # a trainer leader alone on its node
    small = [("w", torch.arange(10, dtype=torch.float32)), ("b", torch.ones(3, dtype=torch.bfloat16))]
    sync.send(small, version=1)
    assert sync.window.slots_count == 1
    slot = sync.window.slots[0]
    assert torch.equal(slot.tensor[:40].view(torch.float32), small[0][1])
    assert torch.equal(slot.tensor[ALIGN : ALIGN + 6].view(torch.bfloat16), small[1][1])
    assert slot.check(version=1, bucket=0) == 2
    large = [(f"w{i}", torch.full((200_000,), float(i))) for i in range(3)]  # 2.4 MB: three 1 MiB buckets
    sync.send(large, version=2)
    assert sync.window.slots_count == 2 and sync.window.capacity >= 800_000
    last = sync.window.slots[2 % 2]
    last.check(version=2, bucket=2)
    assert torch.equal(last.tensor[:800_000].view(torch.float32), large[2][1])
    sync.stop()
    assert sync.window is None
