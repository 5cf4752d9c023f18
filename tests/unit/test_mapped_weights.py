"""Engines that take their weights as views of one buffer (weights.shm_mapped): no copy, same tokens."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.engine.base import SamplingParams
from agentrl.engine.continuous import ContinuousTorchEngine
from agentrl.engine.lean_decoder import stacked
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.tiny import TinyShape, build_tiny_model
from agentrl.weights.base import spec_nbytes, tensor_spec
from agentrl.weights.shm import ALIGN, SharedMemoryWeights, mapped_layout, pieces
from tests.unit.test_continuous_engine import TEXTS, run_episodes


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m", TEXTS, TinyShape(hidden_size=64, num_layers=2, num_heads=4)
    )


def new_weights(model_dir) -> list[tuple[str, torch.Tensor]]:
    """A trainer's next version: the model's weights moved a little."""
    trainer = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(1)
    return [(name, (p + 0.05 * torch.randn_like(p)).detach()) for name, p in trainer.named_parameters()]


def laid_out(named: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]:
    """One buffer holding `named` as the shared window's mapped slot does, and a view of each tensor in it."""
    manifest = [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named]
    offsets, capacity = mapped_layout(manifest)
    buffer = torch.zeros(capacity, dtype=torch.uint8)
    views = []
    for (name, tensor), offset in zip(named, offsets, strict=True):
        raw = buffer[offset : offset + spec_nbytes(tensor_spec(name, tensor))]
        view = raw.view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor)
        views.append((name, view))
    return buffer, views


def inside(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    return buffer.data_ptr() <= tensor.data_ptr() < buffer.data_ptr() + buffer.numel()


def test_the_mapped_layout_puts_weights_then_biases_back_to_back_and_chunks_cover_it():
    manifest = [
        ("q.weight", (8, 16), "float32"),
        ("q.bias", (8,), "float32"),
        ("k.weight", (4, 16), "float32"),
        ("k.bias", (4,), "float32"),
        ("norm.weight", (3,), "bfloat16"),  # 6 bytes: padded to 64
    ]
    offsets, capacity = mapped_layout(manifest)
    chunks = pieces(capacity, bucket_bytes=300)
    assert offsets == [0, 832, 512, 896, 768]  # q.w (512 bytes), k.w (256), norm (64), then q.b, k.b
    assert all(offset % ALIGN == 0 for offset in offsets)
    assert capacity == 960
    assert chunks[0][0] == 0 and chunks[-1][1] == capacity
    assert all(end - start <= 300 for start, end in chunks)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))


def test_stacked_views_tensors_already_back_to_back_and_copies_others():
    memory = torch.arange(24.0)
    top, bottom = memory[:8].view(2, 4), memory[8:20].view(3, 4)
    both = stacked([top, bottom])
    assert both.data_ptr() == memory.data_ptr() and torch.equal(both, memory[:20].view(5, 4))
    apart = stacked([top, memory[12:24].view(3, 4)])  # a gap between them
    assert apart.data_ptr() != memory.data_ptr() and torch.equal(apart[2:], memory[12:24].view(3, 4))


def test_a_mapped_continuous_engine_views_the_buffer_and_samples_like_a_copying_one(model_dir):
    """Every parameter and the lean decoder's fused q/k/v and gate/up products view the buffer; the tokens
    equal an engine's that copied the same weights, and the logprobs a forward pass's; own_weights moves them
    out of the buffer."""
    named = new_weights(model_dir)
    buffer, views = laid_out(named)
    copying = ContinuousTorchEngine(AutoModelForCausalLM.from_pretrained(model_dir).eval(), pad_token_id=0, seed=0)
    mapped = ContinuousTorchEngine(AutoModelForCausalLM.from_pretrained(model_dir).eval(), pad_token_id=0, seed=0)
    copying.load_weights(named, version=1)
    assert mapped.map_weights(views, version=1) and mapped.weight_version == 1
    assert all(inside(p, buffer) for p in mapped.model.parameters())
    prompts = [[1, 5, 9, 2], [3, 3, 7], [4, 8, 12, 16, 20]]

    def greedy(i, turn):
        return SamplingParams(max_new_tokens=3 + (i + turn) % 4, temperature=0.0)

    def sampled(i, turn):
        return SamplingParams(max_new_tokens=3 + (i + turn) % 4, temperature=0.9)

    def same_as_copying():
        """Greedy tokens equal the copying engine's; sampled turns' logprobs equal a forward pass's."""
        episodes = [run_episodes(engine, prompts, 3, greedy) for engine in (mapped, copying)]
        ids = [[out.output_ids.tolist() for episode in run for _, out in episode] for run in episodes]
        run_episodes(mapped, prompts, 3, sampled, model=copying.model)
        return ids[0] == ids[1]

    assert same_as_copying()
    assert mapped.decoder is not None, "the tiny Qwen2 model runs the lean decoder"
    for layer in mapped.decoder.weights:
        assert inside(layer.qkv, buffer) and inside(layer.qkv_bias, buffer) and inside(layer.gate_up, buffer)

    mapped.own_weights()
    assert not any(inside(p, buffer) for p in mapped.model.parameters())
    assert not any(inside(layer.qkv, buffer) for layer in mapped.decoder.weights)
    buffer.zero_()  # the window freed: the engine no longer reads it
    assert same_as_copying()


def test_an_engine_refuses_to_map_weights_of_another_dtype_and_keeps_its_own(model_dir):
    engine = TorchEngine(AutoModelForCausalLM.from_pretrained(model_dir).eval(), pad_token_id=0)
    before = [p.detach().clone() for p in engine.model.parameters()]
    halves = [(name, tensor.to(torch.bfloat16)) for name, tensor in new_weights(model_dir)]
    assert not engine.map_weights(halves, version=1)
    assert engine.weight_version != 1
    assert all(torch.equal(a, b) for a, b in zip(before, engine.model.parameters(), strict=True))
    assert not engine.map_weights(new_weights(model_dir)[1:], version=1)  # one parameter missing


def test_shm_mapped_takes_auto_or_a_bool():
    from mpi4py import MPI

    from agentrl.config import WeightsConfig

    with pytest.raises(ValueError, match="expected 'auto', True or False"):
        SharedMemoryWeights(MPI.COMM_SELF, node=0, bucket_mb=1.0, mapped="yes")
    assert WeightsConfig(shm_mapped="on").shm_mapped is True  # YAML's on/off
    assert WeightsConfig().shm_mapped == "auto"
    with pytest.raises(ValueError, match="shm_mapped"):
        WeightsConfig(shm_mapped="sometimes")


def test_shm_mapped_true_with_a_transport_without_a_window_is_refused_naming_the_fix():
    from agentrl.config import ConfigError, from_dict

    model = {"path": "some/model"}
    with pytest.raises(ConfigError, match=r"shm_mapped=true .*transport=mpi uses none; set weights.transport=shm"):
        from_dict({"model": model, "weights": {"transport": "mpi", "shm_mapped": True}})
    assert from_dict({"model": model, "weights": {"transport": "mpi"}}).weights.shm_mapped == "auto"
