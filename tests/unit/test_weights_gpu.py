"""Pure parts of the GPU weight sync: flat buckets, headers, group offsets, choosing a sync."""

import pytest
import torch

from agentrl.config import ConfigError
from agentrl.weights_gpu import (
    check_alignment,
    flatten_bucket,
    group_offsets,
    make_header,
    resolve_weight_sync,
    spec_nbytes,
    tensor_spec,
    unflatten_bucket,
)


def _named():
    torch.manual_seed(0)
    return [
        ("a.weight", torch.randn(3, 5, dtype=torch.float32)),
        ("b.weight", torch.randn(7, dtype=torch.bfloat16)),
        ("c.bias", torch.randn(2, 2, dtype=torch.bfloat16)),
    ]


def test_flatten_unflatten_round_trip_keeps_bits_and_dtypes():
    named = _named()
    specs = [tensor_spec(n, t) for n, t in named]
    flat = flatten_bucket([t for _, t in named])
    assert flat.dtype == torch.uint8 and flat.numel() == sum(map(spec_nbytes, specs)) == 3 * 5 * 4 + 7 * 2 + 4 * 2
    for (name, original), (got_name, got) in zip(named, unflatten_bucket(flat, specs), strict=True):
        assert got_name == name and got.dtype == original.dtype and got.shape == original.shape
        assert torch.equal(got.view(torch.uint8), original.view(torch.uint8))


def test_unflatten_rejects_a_bucket_of_the_wrong_size():
    named = _named()
    specs = [tensor_spec(n, t) for n, t in named]
    flat = flatten_bucket([t for _, t in named])
    with pytest.raises(ValueError, match="bytes but its manifest"):
        unflatten_bucket(flat[:-2], specs)


def test_unflatten_gives_views_so_loading_reads_the_received_buffer():
    specs = [("x", (4,), "float32")]
    flat = torch.zeros(16, dtype=torch.uint8)
    ((_, view),) = unflatten_bucket(flat, specs)
    flat.view(torch.float32)[2] = 1.5
    assert view[2].item() == 1.5


def test_misaligned_bucket_is_refused_with_a_fix():
    specs = [("odd", (3,), "bfloat16"), ("wide", (2,), "float32")]  # float32 would start at byte 6
    with pytest.raises(ValueError, match="not a multiple of 4"):
        check_alignment(specs)
    check_alignment(list(reversed(specs)))


def test_header_buckets_cover_every_tensor_once_within_the_budget():
    specs = [(f"w{i}", (16,), "float32") for i in range(10)]  # 64 bytes each
    header = make_header(specs, version=7, bucket_bytes=200)
    assert header["version"] == 7 and not header["stop"] and header["manifest"] == specs
    covered = [i for start, end in header["buckets"] for i in range(start, end)]
    assert covered == list(range(10))
    assert all(sum(spec_nbytes(s) for s in specs[a:b]) <= 200 for a, b in header["buckets"])


def test_group_offsets_are_an_exclusive_scan_of_members():
    # trainer leader 1, a torch engine 1, an SGLang engine with tp_size=4, another torch engine
    assert group_offsets([1, 1, 4, 1]) == ([0, 1, 2, 6], 7)


@pytest.mark.parametrize(
    ("choice", "colocate", "on_gpu", "rollouts", "expected"),
    [
        ("auto", False, False, 2, "shm"),
        ("auto", False, True, 2, "nccl"),
        ("auto", True, True, 1, "cuda_ipc"),
        ("auto", True, True, 2, "mpi"),
        ("auto", True, False, 1, "shm"),
        ("shm", False, False, 3, "shm"),
        ("mpi", True, True, 1, "mpi"),
        ("nccl", False, True, 1, "nccl"),
        ("gloo", False, False, 2, "gloo"),
    ],
)
def test_resolve_weight_sync(choice, colocate, on_gpu, rollouts, expected):
    assert resolve_weight_sync(choice, colocate, on_gpu, rollouts) == expected


@pytest.mark.parametrize(
    ("choice", "colocate", "on_gpu", "rollouts", "message"),
    [
        ("nccl", False, False, 1, "weights.transport=nccl needs CUDA"),
        ("nccl", True, True, 2, "NCCL needs one GPU per group member"),
        ("cuda_ipc", False, True, 1, "set layout.colocate=true"),
        ("cuda_ipc", True, False, 1, "needs CUDA"),
        ("cuda_ipc", True, True, 2, "layout.rollout=2"),
    ],
)
def test_impossible_weight_sync_names_the_field_and_fix(choice, colocate, on_gpu, rollouts, message):
    with pytest.raises(ConfigError, match=message):
        resolve_weight_sync(choice, colocate, on_gpu, rollouts)


def test_torch_engine_bucket_update_needs_every_parameter(tiny_model_dir):
    from agentrl.rollout.torch_engine import TorchEngine
    from agentrl.trainer.model import load_causal_lm

    engine = TorchEngine(load_causal_lm(tiny_model_dir), pad_token_id=0)
    named = [(n, p.detach() + 1) for n, p in engine.model.named_parameters()]
    engine.begin_weight_update()
    engine.load_weight_bucket(named[:1])
    with pytest.raises(ValueError, match="left parameters unchanged"):
        engine.end_weight_update(3)
    engine.begin_weight_update()
    engine.load_weight_bucket(named[:2])
    engine.load_weight_bucket(named[2:])
    engine.end_weight_update(3)
    assert engine.weight_version == 3
    assert all(torch.equal(p, t) for (_, t), p in zip(named, engine.model.parameters(), strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU; this machine has none")
def test_cuda_ipc_handle_rebuilds_the_same_bucket_in_another_process():
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor

    named = [(n, t.cuda()) for n, t in _named()]
    flat = flatten_bucket([t for _, t in named])
    context = mp.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_sum_in_child, args=(reduce_tensor(flat), queue))
    child.start()
    total = queue.get(timeout=120)
    child.join(timeout=60)
    assert total == int(flat.sum().item())


def _sum_in_child(handle, queue):
    rebuild, args = handle
    queue.put(int(rebuild(*args).sum().item()))
