"""Single-process parts of the FSDP2 path: layer discovery, activation checkpointing, autocast,
the bucketed sender's gather order, GatherOnly, and the errors that name the fix."""

import numpy as np
import pytest
import torch

from agentrl import transport
from agentrl.config import ConfigError, from_dict
from agentrl.models.loading import load_causal_lm
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer import parallel
from agentrl.trajectory import Episode, pack
from agentrl.weights.base import GatherOnly
from agentrl.weights.mpi import MPIWeightBroadcast


def synthetic_batch(vocab: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    episodes = []
    for group in range(2):
        for _ in range(4):
            e = Episode(group=group, task_seed=group, reward=float(rng.random() < 0.5))
            e.extend(rng.integers(3, vocab, size=5), mask=0)
            e.extend(rng.integers(3, vocab, size=9), mask=1, logprobs=-rng.random(9) * 3)
            episodes.append(e)
    return pack(episodes)


def test_decoder_layers_of_a_causal_lm(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    assert len(parallel.decoder_layers(model)) == model.config.num_hidden_layers


def test_decoder_layers_missing_names_the_fix():
    with pytest.raises(ValueError, match=r"parallelism\.fsdp=false"):
        parallel.decoder_layers(torch.nn.Linear(2, 2))


def _saved_tensors_and_grads(model_dir, checkpointed: bool):
    model = load_causal_lm(str(model_dir)).train()
    if checkpointed:
        parallel.enable_activation_checkpointing(model)
    saved = []
    ids = torch.arange(3, 19).reshape(2, 8)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(1) or t, lambda t: t):
        loss = model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean()
    loss.backward()
    return len(saved), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_activation_checkpointing_saves_less_and_keeps_gradients(tiny_model_dir):
    plain_saved, plain_grads = _saved_tensors_and_grads(tiny_model_dir, checkpointed=False)
    ckpt_saved, ckpt_grads = _saved_tensors_and_grads(tiny_model_dir, checkpointed=True)
    assert ckpt_saved < plain_saved / 2  # only each layer's inputs are kept for backward
    assert list(plain_grads) == list(ckpt_grads)  # parameter names unchanged
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, msg=name)


def test_compute_context_autocasts_only_the_replicated_path():
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with parallel.compute_context("cpu", "bf16", sharded=False):
        assert layer(x).dtype == torch.bfloat16
    with parallel.compute_context("cpu", "bf16", sharded=True):
        assert layer(x).dtype == torch.float32  # FSDP's MixedPrecisionPolicy casts instead
    with parallel.compute_context("cpu", "none", sharded=False):
        assert layer(x).dtype == torch.float32


def test_fsdp_with_one_trainer_rank_is_a_config_error(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"layout\.trainer"):
        from_dict({"model": {"path": str(tiny_model_dir)}, "parallelism": {"fsdp": True}})
    config = from_dict(
        {"model": {"path": str(tiny_model_dir)}, "layout": {"trainer": 2}, "parallelism": {"fsdp": True}}
    )
    with pytest.raises(ConfigError, match=r"layout\.trainer"):  # world size 1 runs one trainer whatever the layout
        policy_trainer(config, str(tiny_model_dir), "cpu", group=None)


def test_bf16_autocast_trains_float32_master_weights(tiny_model_dir):
    config = from_dict(
        {
            "model": {"path": str(tiny_model_dir), "dtype": "bfloat16"},
            "parallelism": {"mixed_precision": "bf16", "activation_checkpointing": True},
            "optimizer": {"lr": 1e-2},
        }
    )
    trainer = policy_trainer(config, str(tiny_model_dir), "cpu")
    before = {name: t.clone() for name, t in trainer.named_weights()}
    assert all(t.dtype == torch.float32 for t in before.values())
    metrics = trainer.train_step(synthetic_batch(trainer.model.config.vocab_size))
    assert np.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    after = dict(trainer.named_weights())
    assert all(t.dtype == torch.float32 for t in after.values())
    assert max(float((after[n] - before[n]).abs().max()) for n in before) > 1e-3


class FakeShard:
    """Stands in for a DTensor: records when it is gathered."""

    def __init__(self, name: str, full: torch.Tensor, events: list):
        self.name, self.full, self.events = name, full, events
        self.shape, self.dtype = full.shape, full.dtype

    def numel(self):
        return self.full.numel()

    def element_size(self):
        return self.full.element_size()

    def full_tensor(self):
        self.events.append(("gather", self.name))
        return self.full


def test_send_gathers_each_bucket_just_before_broadcasting_it(monkeypatch):
    from mpi4py import MPI

    events, sent = [], []

    def record_bcast(comm, array, root=0, **polling):
        events.append(("bcast", len(sent)))
        sent.append(np.array(array, copy=True))

    monkeypatch.setattr(transport, "bcast_object", lambda comm, obj, root=0: obj)
    monkeypatch.setattr(transport, "bcast_array", record_bcast)
    tensors = {f"w{i}": torch.full((256,), float(i)) for i in range(5)}  # 1 KiB each
    named = [(name, FakeShard(name, t, events)) for name, t in tensors.items()]
    MPIWeightBroadcast(MPI.COMM_SELF, bucket_mb=2.5 / 1024).send(named, version=3)  # 2 tensors per bucket
    assert events == [
        ("gather", "w0"),
        ("gather", "w1"),
        ("bcast", 0),
        ("gather", "w2"),
        ("gather", "w3"),
        ("bcast", 1),
        ("gather", "w4"),
        ("bcast", 2),
    ]
    expected = torch.cat([t.view(torch.uint8) for t in tensors.values()]).numpy()
    assert np.array_equal(np.concatenate(sent), expected)


def test_gather_only_walks_every_tensor_in_order_and_never_receives():
    events = []
    named = [(f"w{i}", FakeShard(f"w{i}", torch.zeros(3), events)) for i in range(4)]
    GatherOnly().send(named, version=1)
    assert events == [("gather", f"w{i}") for i in range(4)]
    with pytest.raises(RuntimeError, match="never receive"):
        GatherOnly().receive(engine=None)
