"""LoRA policies on one shared base (engine/shared_lora.py): one copy of the base in the engine, each policy's turns
generated with its own adapter exactly as a merged copy of base + adapter generates them (alone or batched with the
other policy's rows), syncs that carry only the adapter, and the config that decides who shares."""

import asyncio

import pytest
import torch

from agentrl.config import ConfigError, from_dict
from agentrl.config.policies import shared_bases
from agentrl.config.schema import LoraConfig
from agentrl.engine.base import SamplingParams
from agentrl.engine.shared_lora import SharedBaseEngine
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.loading import load_causal_lm, load_tokenizer
from agentrl.trainer.lora import adapter_weights, apply_lora
from agentrl.weights.lora import adapter_checksum

pytest.importorskip("peft")

PROMPTS = [[5, 17, 33, 8], [40, 2, 9], [11, 12, 13, 14, 15, 16], [7]]


Lora = LoraConfig(rank=4, alpha=8)  # every Linear of the layers, as the default target_modules


def random_adapter(model_dir, seed: int):
    """A PEFT model on the base with adapters far from zero: (its sync tensors, PEFT's merged plain model)."""
    peft_model = apply_lora(load_causal_lm(str(model_dir), "float32", "cpu"), Lora, str(model_dir))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    sent = [(name, tensor.clone()) for name, tensor in adapter_weights(peft_model)]
    return sent, peft_model.merge_and_unload()


def shared_engine(model_dir) -> SharedBaseEngine:
    pad = load_tokenizer(str(model_dir)).pad_token_id
    return SharedBaseEngine(load_causal_lm(str(model_dir), "float32", "cpu"), pad_token_id=pad, seed=0)


def generate_all(engine, prompts, sampling):
    async def run():
        return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))

    return asyncio.run(run())


def generate_mixed(engines, prompts, sampling):
    """Every (engine, prompt) request at once, so the shared engine batches both policies' rows together."""

    async def run():
        return await asyncio.gather(*(e.generate(p, sampling) for e in engines for p in prompts))

    return asyncio.run(run())


GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def two_adapters(tiny_model_dir):
    return random_adapter(tiny_model_dir, 1), random_adapter(tiny_model_dir, 2)


def test_each_policy_generates_as_a_merged_copy_of_base_and_its_adapter(tiny_model_dir, two_adapters):
    shared = shared_engine(tiny_model_dir)
    engines = {"proposer": shared.adapter("proposer", Lora.scaling), "solver": shared.adapter("solver", Lora.scaling)}
    base_out = [o.output_ids.tolist() for o in generate_all(engines["proposer"], PROMPTS, GREEDY)]
    pad = load_tokenizer(str(tiny_model_dir)).pad_token_id
    plain_base = TorchEngine(load_causal_lm(str(tiny_model_dir), "float32", "cpu"), pad_token_id=pad)
    assert base_out == [o.output_ids.tolist() for o in generate_all(plain_base, PROMPTS, GREEDY)]  # no adapter yet
    expected = {}
    for (name, engine), (sent, merged) in zip(engines.items(), two_adapters, strict=True):
        engine.load_weights(sent, version=3)
        reference = TorchEngine(merged, pad_token_id=pad)
        expected[name] = generate_all(reference, PROMPTS, GREEDY)
        assert engine.weight_version == 3 and engine.loaded_checksum == adapter_checksum(sent)
    assert any(
        a.output_ids.tolist() != b.output_ids.tolist() for a, b in zip(*expected.values(), strict=True)
    )  # the two adapters generate differently, so a row routed to the wrong one would show
    alone = {name: generate_all(engine, PROMPTS, GREEDY) for name, engine in engines.items()}
    mixed = generate_mixed(list(engines.values()), PROMPTS, GREEDY)
    together = {"proposer": mixed[: len(PROMPTS)], "solver": mixed[len(PROMPTS) :]}
    assert shared.stats["largest_batch"] == 2 * len(PROMPTS)  # both policies' rows ran in one batch
    for name in engines:
        for got in (alone[name], together[name]):
            assert [o.output_ids.tolist() for o in got] == [o.output_ids.tolist() for o in expected[name]]
            for o, e in zip(got, expected[name], strict=True):
                torch.testing.assert_close(torch.tensor(o.logprobs), torch.tensor(e.logprobs), atol=1e-4, rtol=0)
                assert o.weight_version == 3


def test_copies_of_a_prompt_share_a_prefill_only_within_their_adapter(tiny_model_dir, two_adapters):
    """Two copies of every prompt under each adapter, in one batch: each adapter's copies share one prefill (engine/
    shared_prompts.py), the two adapters' never do, and every row generates as its adapter's merged copy."""
    shared = shared_engine(tiny_model_dir)
    engines = [shared.adapter(name, Lora.scaling) for name in ("proposer", "solver")]
    pad = load_tokenizer(str(tiny_model_dir)).pad_token_id
    expected = []
    for engine, (sent, merged) in zip(engines, two_adapters, strict=True):
        engine.load_weights(sent, version=1)
        expected += generate_all(TorchEngine(merged, pad_token_id=pad), PROMPTS * 2, GREEDY)
    mixed = generate_mixed(engines, PROMPTS * 2, GREEDY)
    assert shared.stats["batches"] == 1
    once = sum(map(len, PROMPTS))
    assert shared.stats["prefill_tokens"] == 2 * once and shared.stats["shared_tokens"] == 2 * once
    for got, want in zip(mixed, expected, strict=True):
        assert got.output_ids.tolist() == want.output_ids.tolist()
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4, rtol=0)


def test_the_engine_holds_one_base_and_a_sync_moves_only_the_adapter(tiny_model_dir, two_adapters):
    shared = shared_engine(tiny_model_dir)
    base = {name: p.data_ptr() for name, p in shared.model.named_parameters()}
    base_bytes = shared.base_bytes()
    engines = [shared.adapter(name, Lora.scaling) for name in ("proposer", "solver")]
    for engine, (sent, _) in zip(engines, two_adapters, strict=True):
        engine.begin_weight_update()
        engine.load_weight_bucket(sent[: len(sent) // 2])  # bucket by bucket, as the MPI broadcast delivers
        engine.load_weight_bucket(sent[len(sent) // 2 :])
        engine.end_weight_update(1)
        assert engine.bytes_received == sum(t.numel() * t.element_size() for _, t in sent)
    assert engines[0].model is engines[1].model is shared.model
    assert {name: p.data_ptr() for name, p in shared.model.named_parameters()} == base  # the base was not rewritten
    assert shared.base_bytes() == base_bytes
    one_adapter = sum(t.numel() * t.element_size() for _, t in two_adapters[0][0])
    assert shared.adapter_bytes() == 2 * one_adapter
    assert one_adapter < base_bytes / 3
    with pytest.raises(ValueError, match="modules_to_save: \\[\\] for them"):
        engines[0].load_weights([("model.norm.weight", torch.ones(32))], version=2)


def test_a_request_naming_an_adapter_the_engine_lacks_fails(tiny_model_dir):
    shared = shared_engine(tiny_model_dir)
    shared.adapter("proposer", 2.0)
    (out,) = generate_all(shared, [[3, 4]], SamplingParams(max_new_tokens=2, temperature=0.0, adapter="proposer"))
    assert out.weight_version == -1
    with pytest.raises(ValueError, match=r"adapters \['critic'\], which this engine does not hold"):
        generate_all(shared, [[3, 4]], SamplingParams(max_new_tokens=2, adapter="critic"))


# --- the config ---------------------------------------------------------------------------------------------------


def relay(model_dir, policies, **extra):
    raw = {
        "model": {"path": str(model_dir)},
        "env": {"id": "relay", "kwargs": {"numbers": 3}},
        "layout": {"trainer": 2, "rollout": 1},
        "policies": policies,
        "game": {"players": {"proposer": "proposer", "solver": "solver"}},
        "rollout": {"tasks_per_step": 2, "group_size": 4, "max_turns": 1, "max_new_tokens": 2},
        **extra,
    }
    return from_dict(raw)


def test_policies_with_adapters_on_one_base_share_it(tiny_model_dir, tmp_path):
    by_policy = relay(tiny_model_dir, {"proposer": {"lora": {"rank": 4}}, "solver": {"lora": {"rank": 8}}})
    assert shared_bases(by_policy) == [["proposer", "solver"]]
    top_level = relay(
        tiny_model_dir, {"proposer": {}, "solver": {}}, model={"path": str(tiny_model_dir), "lora": {"rank": 4}}
    )
    assert shared_bases(top_level) == [["proposer", "solver"]]
    full = relay(tiny_model_dir, {"proposer": {"lora": {}}, "solver": {}})  # one adapter, one full copy
    assert shared_bases(full) == []
    other = relay(
        tiny_model_dir,
        {"proposer": {"lora": {}}, "solver": {"model": {"path": str(tmp_path / "other"), "lora": {}}}},
    )
    assert shared_bases(other) == []  # different bases: a copy each, as before


@pytest.mark.parametrize(
    ("policies", "extra", "fix"),
    [
        (
            {"proposer": {"lora": {"modules_to_save": ["norm"]}}, "solver": {"lora": {}}},
            {},
            "policies.proposer.lora.modules_to_save=\\[\\]",
        ),
        (
            {"proposer": {"lora": {}}, "solver": {"lora": {}}},
            {"rollout": {"tasks_per_step": 2, "group_size": 4, "engine": {"scheduler": "continuous"}}},
            "rollout.engine.scheduler=batch",
        ),
        (
            {"proposer": {"lora": {}, "model": {"path": "x", "lora": {}}}, "solver": {}},
            {},
            "policies.proposer: set lora under policies.proposer.model",
        ),
    ],
)
def test_what_a_shared_base_cannot_run_is_refused_naming_the_fix(tiny_model_dir, policies, extra, fix):
    with pytest.raises(ConfigError, match=fix):
        relay(tiny_model_dir, policies, **extra)


def test_the_rollout_worker_holds_one_base_for_policies_that_share_it(tiny_model_dir, tmp_path, two_adapters):
    import shutil

    from agentrl.policies.worker import MultiPolicyWorker

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    lora = {"rank": 4, "alpha": 8}
    shared = relay(tiny_model_dir, {"proposer": {"lora": lora}, "solver": {"lora": lora}})
    separate = relay(
        tiny_model_dir, {"proposer": {"lora": lora}, "solver": {"model": {"path": str(copy), "lora": lora}}}
    )
    held = {}
    for label, config in (("shared", shared), ("separate", separate)):
        worker = MultiPolicyWorker(config, None, 0, 1, "cpu")
        for engine, (sent, _) in zip(worker.engines.values(), two_adapters, strict=True):
            engine.load_weights(sent, version=1)
        held[label] = worker.memory()
        models = [engine.model for engine in worker.engines.values()]
        assert (models[0] is models[1]) == (label == "shared")
        if label == "shared":
            pointers = [{n: p.data_ptr() for n, p in m.named_parameters()} for m in models]
            assert pointers[0] == pointers[1]
    base = load_causal_lm(str(tiny_model_dir), "float32", "cpu")
    one_base = sum(t.numel() * t.element_size() for t in [*base.parameters(), *base.buffers()])
    assert held["shared"]["weights"] == one_base
    assert held["separate"]["weights"] > 2 * one_base  # two copies, and each merging engine's float32 base weights
    assert held["shared"]["adapters"] == sum(t.numel() * t.element_size() for (s, _) in two_adapters for _, t in s)
