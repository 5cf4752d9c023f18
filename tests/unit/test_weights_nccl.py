"""Pure parts of the GPU weight sync: flat buckets, headers, group offsets, choosing a sync."""

import itertools
import sys
import types
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from agentrl.config import ConfigError, LayoutConfig
from agentrl.layout import Role, shared_trainer_gpu
from agentrl.run.plan import JobShape, plan
from agentrl.weights import resolve_weight_sync
from agentrl.weights.nccl import (
    check_alignment,
    flatten_bucket,
    group_offsets,
    make_header,
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


CPU = [(0, None)]


@pytest.mark.parametrize(
    ("choice", "colocate", "leader", "rollouts", "expected"),
    [
        ("auto", False, (0, None), CPU * 2, "shm"),
        ("auto", False, (0, 0), [(0, 1), (0, 2)], "nccl"),
        ("auto", False, (0, 0), [(1, 0), (1, 1)], "nccl"),  # the same index on another node is another GPU
        ("auto", True, (0, 0), [(0, 0)], "cuda_ipc"),
        ("auto", False, (0, 0), [(0, 0), (0, 0)], "cuda_ipc"),  # one GPU for all: the quickstart on one GPU
        ("auto", True, (0, 0), [(0, 0), (0, 1)], "shm"),  # colocated pairs on two GPUs
        ("auto", False, (0, 0), [(0, 1), (0, 0), (0, 1)], "shm"),
        ("auto", False, (0, 0), [(0, 1), (0, 1)], "shm"),  # two engines on one GPU, not the leader's
        ("auto", True, (0, None), CPU, "shm"),
        ("shm", False, (0, None), CPU * 3, "shm"),
        ("shm", False, (0, 0), [(0, 0)], "shm"),
        ("mpi", True, (0, 0), [(0, 0)], "mpi"),
        ("nccl", False, (0, 0), [(0, 1)], "nccl"),
        ("cuda_ipc", False, (0, 0), [(0, 0), (0, 0), (0, 0)], "cuda_ipc"),
        ("gloo", False, (0, None), CPU * 2, "gloo"),
    ],
)
def test_resolve_weight_sync(choice, colocate, leader, rollouts, expected):
    assert resolve_weight_sync(choice, colocate, leader, rollouts) == expected


def test_an_engine_over_several_gpus_shares_any_of_them():
    # SGLang tp_size=2 from GPU 1 covers GPUs 1-2; the next engine from GPU 2 would share GPU 2 with it.
    assert resolve_weight_sync("auto", False, (0, 0), [(0, 1), (0, 3)], rollout_gpus=2) == "nccl"
    assert resolve_weight_sync("auto", False, (0, 0), [(0, 1), (0, 2)], rollout_gpus=2) == "shm"
    # An engine starting on the leader's GPU spans another one too: not all on the leader's GPU.
    assert resolve_weight_sync("auto", False, (0, 0), [(0, 0)], rollout_gpus=2) == "shm"
    with pytest.raises(ConfigError, match=r"rollout.engine.tp_size=2 GPUs; use weights.transport=auto"):
        resolve_weight_sync("cuda_ipc", False, (0, 0), [(0, 0)], rollout_gpus=2)


@pytest.mark.parametrize(
    ("choice", "colocate", "leader", "rollouts", "message"),
    [
        ("nccl", False, (0, None), CPU, r"weights.transport=nccl needs CUDA .* Use weights.transport=auto, shm or mpi"),
        (
            "nccl",
            True,
            (0, 0),
            [(0, 0), (0, 1)],
            r"the trainer leader and rollout role_rank 0 share node 0's cuda:0 \(layout.colocate=true\); "
            r"use weights.transport=auto \(picks shm here\), shm or mpi$",
        ),
        (
            "nccl",
            False,
            (0, 0),
            [(0, 0), (0, 0)],
            r"the trainer leader and rollout role_rank 0 share node 0's cuda:0; "
            r"use weights.transport=auto \(picks cuda_ipc here\), cuda_ipc or shm$",
        ),
        (
            "nccl",
            False,
            (0, 0),
            [(0, 1), (0, 1)],
            r"rollout role_rank 0 and rollout role_rank 1 share node 0's cuda:1; use weights.transport=auto",
        ),
        (
            "cuda_ipc",
            False,
            (0, 0),
            [(0, 1)],
            r"every rollout rank on the trainer leader's GPU \(node 0's cuda:0\), but rollout role_rank 0 is on "
            r"node 0's cuda:1; use weights.transport=auto \(picks nccl here\), shm or nccl$",
        ),
        ("cuda_ipc", True, (0, 0), [(0, 0), (1, 0)], r"rollout role_rank 1 is on node 1's cuda:0"),
        ("cuda_ipc", True, (0, None), CPU, r"weights.transport=cuda_ipc needs CUDA"),
    ],
)
def test_impossible_weight_sync_names_the_field_and_fix(choice, colocate, leader, rollouts, message):
    with pytest.raises(ConfigError, match=message) as error:
        resolve_weight_sync(choice, colocate, leader, rollouts)
    assert "\n" not in str(error.value)


def _resolve(rows, choice, colocate=False, rollout_gpus=1):
    leader = next(row for row in rows if row.role is Role.TRAINER)
    rollouts = [(row.node, row.gpu) for row in rows if row.role is Role.ROLLOUT]
    return resolve_weight_sync(choice, colocate, (leader.node, leader.gpu), rollouts, rollout_gpus)


def _splits(world_size: int):
    """(trainer, rollout, env) for a world: every split with at least one trainer and one rollout rank."""
    for trainer in range(1, world_size):
        for rollout in range(1, world_size - trainer + 1):
            yield trainer, rollout, world_size - trainer - rollout


def test_auto_never_puts_two_members_of_an_nccl_group_on_one_gpu():
    """Every split of 2 to 16 ranks over 1 or 2 nodes of 1, 2 or 8 GPUs, colocated or not, tp_size 1 or 2."""
    checked = Counter()
    for gpus_per_node, world_size in itertools.product((1, 2, 8), range(2, 17)):
        for (trainer, rollout, env), colocate, two_nodes, tp in itertools.product(
            _splits(world_size), (False, True), (False, True), (1, 2)
        ):
            if tp > gpus_per_node or (colocate and tp > 1):
                continue
            config = LayoutConfig(trainer=trainer, rollout=rollout, env=env, colocate=colocate)
            per_node = -(-world_size // 2) if two_nodes else None
            try:
                rows = plan(config, JobShape(world_size, per_node, gpus_per_node), tp)
            except ConfigError:  # colocate needs rollout <= trainer, each pair on one node
                assert colocate
                continue
            members = [rows[0]] + [row for row in rows if row.role is Role.ROLLOUT]
            spans = [[(row.node, row.gpu + i) for i in range(1 if row is rows[0] else tp)] for row in members]
            used = [gpu for span in spans for gpu in span]
            shared = len(set(used)) < len(used)
            on_leaders_gpu = tp == 1 and all((row.node, row.gpu) == (rows[0].node, rows[0].gpu) for row in members)
            auto = _resolve(rows, "auto", colocate, tp)
            assert auto == ("cuda_ipc" if on_leaders_gpu else "shm" if shared else "nccl"), rows
            assert [row.weights for row in rows if row.role is Role.ROLLOUT] == [auto] * rollout or auto == "shm"
            if shared:
                with pytest.raises(ConfigError, match=r"share node \d+'s cuda:\d+.*; use weights.transport=auto"):
                    _resolve(rows, "nccl", colocate, tp)
            else:
                assert _resolve(rows, "nccl", colocate, tp) == "nccl"
            if on_leaders_gpu:
                assert _resolve(rows, "cuda_ipc", colocate, tp) == "cuda_ipc"
            else:
                with pytest.raises(ConfigError, match=r"needs every rollout rank on the trainer leader's GPU"):
                    _resolve(rows, "cuda_ipc", colocate, tp)
            assert _resolve(rows, "shm", colocate, tp) == "shm" and _resolve(rows, "mpi", colocate, tp) == "mpi"
            checked[auto] += 1
            # The trainers' own group: trainer ranks come first on their nodes, so they share a GPU exactly where a
            # node holds more of them than GPUs; NCCL cannot run there, so FSDP is refused and replicas use gloo.
            trainers_per_node = Counter(row.node for row in rows if row.role is Role.TRAINER)
            crowded = max(trainers_per_node.values()) > gpus_per_node
            shared = shared_trainer_gpu([r.role for r in rows], [r.node for r in rows], [r.gpu for r in rows])
            assert (shared is not None) == crowded, rows
            if crowded:
                first, second, node, gpu = shared
                assert rows[first].gpu == rows[second].gpu == gpu and rows[first].node == rows[second].node == node
                with pytest.raises(ConfigError, match=r"trainer ranks \d+ and \d+ share node \d+'s cuda:\d+"):
                    plan(config, JobShape(world_size, per_node, gpus_per_node), tp, fsdp=True)
                checked["trainers share a GPU"] += 1
            elif trainer > 1:
                plan(config, JobShape(world_size, per_node, gpus_per_node), tp, fsdp=True)
    assert min(checked[name] for name in ("nccl", "cuda_ipc", "shm", "trainers share a GPU")) > 100, checked


def test_trainer_ranks_sharing_a_gpu_reduce_over_gloo():
    from agentrl.trainer.model import trainer_backend

    assert trainer_backend("cuda:0", shares_gpu=False) == "nccl"
    assert trainer_backend("cuda:0", shares_gpu=True) == "gloo"
    assert trainer_backend("cpu", shares_gpu=False) == "gloo"
    rows = plan(LayoutConfig(trainer=2, rollout=1, env=0), JobShape(3, gpus_per_node=1))
    assert [row.gpu for row in rows] == [0, 0, 0]
    assert shared_trainer_gpu([r.role for r in rows], [r.node for r in rows], [r.gpu for r in rows]) == (0, 1, 0, 0)
    with pytest.raises(ConfigError, match=r"parallelism.fsdp=false \(replicas then reduce over gloo\)"):
        plan(LayoutConfig(trainer=2, rollout=1, env=0), JobShape(3, gpus_per_node=1), fsdp=True)
    assert plan(LayoutConfig(trainer=2, rollout=1, env=0), JobShape(3, gpus_per_node=2), fsdp=True)[1].gpu == 1


@pytest.mark.parametrize("leader, rollouts", [((0, 0), [(0, 0), (0, 0)]), ((0, 0), [(0, 1)]), ((0, None), CPU)])
def test_lora_adapters_travel_over_a_cpu_transport_wherever_the_ranks_sit(leader, rollouts):
    assert resolve_weight_sync("auto", False, leader, rollouts, lora=True) == "shm"
    assert resolve_weight_sync("mpi", False, leader, rollouts, lora=True) == "mpi"
    for choice in ("nccl", "cuda_ipc", "gloo"):
        with pytest.raises(
            ConfigError, match=f"weights.transport={choice}; set weights.transport=auto \\(picks shm\\)"
        ):
            resolve_weight_sync(choice, False, leader, rollouts, lora=True)


@pytest.mark.parametrize(
    ("gpus_per_node", "trainer", "rollout", "env", "colocate", "expected"),
    [
        (1, 1, 2, 1, False, "cuda_ipc"),  # the quickstart on one GPU: every rank on cuda:0
        (8, 1, 2, 1, False, "nccl"),  # the quickstart on eight: one GPU each
        (2, 1, 3, 0, False, "shm"),  # rollout ranks on cuda:1, cuda:0, cuda:1
        (0, 1, 2, 1, False, "shm"),  # CPU
        (8, 1, 1, 0, True, "cuda_ipc"),
        (8, 2, 2, 0, True, "shm"),  # two colocated pairs on two GPUs
        (0, 1, 1, 0, True, "shm"),
    ],
)
def test_the_transport_auto_picks_for_known_layouts(gpus_per_node, trainer, rollout, env, colocate, expected):
    config = LayoutConfig(trainer=trainer, rollout=rollout, env=env, colocate=colocate)
    rows = plan(config, JobShape(trainer + rollout + env, gpus_per_node=gpus_per_node))
    assert _resolve(rows, "auto", colocate) == expected
    if (gpus_per_node, trainer, rollout) == (2, 1, 3):
        assert [row.gpu for row in rows] == [0, 1, 0, 1]


def test_make_weight_sync_resolves_from_the_layouts_placements(monkeypatch):
    from agentrl.weights import make_weight_sync

    made = []
    fake = types.ModuleType("agentrl.weights.cuda_ipc")
    fake.CUDAIPCWeightSync = lambda comm, bucket_mb, device, sleeps: made.append((comm, bucket_mb, device, sleeps))
    monkeypatch.setitem(sys.modules, "agentrl.weights.cuda_ipc", fake)
    roles = [Role.TRAINER, Role.ROLLOUT, Role.ROLLOUT, Role.ENV]
    layout = SimpleNamespace(roles=roles, nodes=[0] * 4, gpus=[0, 0, 0, None], weight_comm="comm", device="cuda:0")
    placement = {"rollout_gpus": 1, "lora": None, "mapped": "auto", "in_place": "auto"}
    weights = SimpleNamespace(transport="auto", bucket_mb=8.0)
    for colocate in (False, True):
        make_weight_sync(weights, layout, colocate=colocate, **placement)
    assert made == [("comm", 8.0, "cuda:0", False), ("comm", 8.0, "cuda:0", True)]
    weights.transport = "nccl"
    with pytest.raises(ConfigError, match=r"rollout role_rank 0 share node 0's cuda:0"):
        make_weight_sync(weights, layout, colocate=True, **placement)


def test_torch_engine_bucket_update_needs_every_parameter(tiny_model_dir):
    from agentrl.engine.torch_engine import TorchEngine
    from agentrl.models.loading import load_causal_lm

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
