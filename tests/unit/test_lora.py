"""LoRA (model.lora): config refusals, adapter-only syncs merged by the torch engine as PEFT merges, the confirmation
that stops a run on stale adapters, and adapter checkpoints: save, resume, eval's folder check, merged export."""

import copy
import json

import numpy as np
import pytest
import torch
from mpi4py import MPI

from agentrl.config import ConfigError, from_dict
from agentrl.engine.torch_engine import TorchEngine
from agentrl.errors import UserError
from agentrl.models.adapters import ADAPTER_CONFIG
from agentrl.models.loading import load_causal_lm, load_tokenizer
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer import checkpoint
from agentrl.trainer.policy_trainer import PolicyTrainer
from agentrl.trajectory import Episode, pack
from agentrl.weights.lora import ConfirmedAdapterSync, StaleWeights, adapter_checksum, check_reports
from agentrl.weights.mpi import MPIWeightBroadcast

pytest.importorskip("peft")


def lora_config(model_dir, run_dir="runs/x", **lora):
    return from_dict(
        {
            "run_dir": str(run_dir),
            "model": {"path": str(model_dir), "lora": {"rank": 4, "alpha": 8, **lora}},
            "trainer": {"micro_batch_size": 4},
            "optimizer": {"lr": 0.05},
        }
    )


def batch(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    episodes = []
    for group in range(2):
        for _ in range(4):
            e = Episode(group=group, task_seed=0, reward=float(rng.random() < 0.5), finish="terminated")
            e.extend([int(t) for t in rng.integers(3, 90, size=4)], mask=0)
            e.extend([int(t) for t in rng.integers(3, 90, size=3)], mask=1)
            episodes.append(e)
    return pack(episodes)


def trained(model_dir, run_dir="runs/x", steps=2, **lora) -> PolicyTrainer:
    trainer = policy_trainer(lora_config(model_dir, run_dir, **lora), str(model_dir), "cpu")
    for step in range(steps):
        trainer.train_step(batch(step))
    return trainer


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        ({"weights": {"transport": "nccl"}}, "weights.transport=shm or mpi"),
        ({"weights": {"shm_in_place": True}}, "weights.shm_in_place=auto or false"),
    ],
)
def test_lora_refuses_what_cannot_take_adapters(overrides, fix):
    with pytest.raises(ConfigError, match=r"model\.lora") as error:
        from_dict({"model": {"path": "m", "lora": {}}, **overrides})
    assert fix in str(error.value)


def test_target_modules_that_match_nothing_list_the_models_modules(tiny_model_dir):
    with pytest.raises(UserError, match=r"\['qkv'\] match no Linear module") as error:
        policy_trainer(lora_config(tiny_model_dir, target_modules=["q_proj", "qkv"]), str(tiny_model_dir), "cpu")
    assert "'q_proj'" in str(error.value) and "'down_proj'" in str(error.value)
    with pytest.raises(UserError, match=r"adapts \['lm_head'\], whose weight is tied"):
        policy_trainer(lora_config(tiny_model_dir, target_modules=["q_proj", "lm_head"]), str(tiny_model_dir), "cpu")
    with pytest.raises(UserError, match=r"modules_to_save \['nrm'\] match no module") as error:
        policy_trainer(lora_config(tiny_model_dir, modules_to_save=["nrm"]), str(tiny_model_dir), "cpu")
    assert "'norm'" in str(error.value)


def test_only_adapters_train_and_the_sync_sends_only_them(tiny_model_dir):
    trainer = policy_trainer(lora_config(tiny_model_dir), str(tiny_model_dir), "cpu")
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert all("lora_" in n for n, p in trainer.model.named_parameters() if p.requires_grad)
    assert len(trainer.optimizer.param_groups[0]["params"]) == len(trainer.named_weights())
    for step in range(2):
        trainer.train_step(batch(step))
    for name, param in trainer.model.named_parameters():
        if name in frozen:
            assert torch.equal(param, frozen[name]), name
    named = trainer.named_weights()
    assert named and all(n.endswith((".lora_A", ".lora_B")) for n, _ in named)
    assert any(t.abs().sum() > 0 for n, t in named if n.endswith("lora_B"))  # B left zero: nothing learned
    sync = ConfirmedAdapterSync(MPIWeightBroadcast(MPI.COMM_SELF, bucket_mb=1.0), MPI.COMM_SELF)
    sync.send(named, version=2)
    full = sum(p.numel() * p.element_size() for p in load_causal_lm(str(tiny_model_dir)).parameters())
    adapters = sum(p.numel() * p.element_size() for n, p in trainer.model.named_parameters() if "lora_" in n)
    assert sync.bytes_sent == adapters < full / 3


def engine_for(model_dir, scaling: float) -> TorchEngine:
    engine = TorchEngine(load_causal_lm(str(model_dir)), pad_token_id=0)
    engine.use_lora(scaling)
    return engine


def load_bucketed(engine, named, version: int) -> None:
    engine.begin_weight_update()
    half = len(named) // 2
    for bucket in (named[:half], named[half:]):  # as a transport loads: bucket by bucket, out of reused buffers
        engine.load_weight_bucket([(n, t.clone()) for n, t in bucket])
    engine.end_weight_update(version)


def assert_engine_holds_peft_merge(engine, trainer) -> None:
    merged = copy.deepcopy(trainer.model).merge_and_unload()
    ours = dict(engine.model.named_parameters())
    for name, param in merged.named_parameters():
        torch.testing.assert_close(ours[name], param, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("saved", [[], ["norm"], ["norm", "embed_tokens"]])
def test_engine_merges_each_version_from_the_base_as_peft_does(tiny_model_dir, saved):
    trainer = trained(tiny_model_dir, steps=2, modules_to_save=saved)
    whole = [n for n, _ in trainer.named_weights() if not n.endswith((".lora_A", ".lora_B"))]
    assert ("model.norm.weight" in whole) == bool(saved) and bool(whole) == bool(saved)  # norms synced whole
    assert ("model.embed_tokens.weight" in whole) == ("embed_tokens" in saved)
    assert "lm_head.weight" not in whole  # tied: the one trained embedding is both input and output
    engine = engine_for(tiny_model_dir, trainer.model_config.lora.scaling)
    base_q = engine.model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    load_bucketed(engine, trainer.named_weights(), version=2)
    assert engine.weight_version == 2
    assert not torch.equal(engine.model.model.layers[0].self_attn.q_proj.weight, base_q)
    assert_engine_holds_peft_merge(engine, trainer)
    assert engine.loaded_checksum == adapter_checksum(trainer.named_weights())
    for step in range(2, 4):
        trainer.train_step(batch(step))
    load_bucketed(engine, trainer.named_weights(), version=4)  # merged from the base, not on top of version 2
    assert_engine_holds_peft_merge(engine, trainer)
    engine.load_weights(trainer.named_weights(), version=5)  # single-process mode's path
    assert engine.weight_version == 5
    assert_engine_holds_peft_merge(engine, trainer)
    if "embed_tokens" in saved:
        trained_embedding = dict(trainer.named_weights())["model.embed_tokens.weight"]
        head = trainer.model.get_output_embeddings()
        assert torch.equal(head(torch.eye(trained_embedding.shape[1])).T, trained_embedding)  # the head trains too
        torch.testing.assert_close(engine.model.lm_head.weight, trained_embedding)


def test_a_tied_embedding_is_kept_tied_by_its_short_or_full_name(tiny_model_dir):
    from agentrl.trainer.lora import saves_tied_weight

    model = load_causal_lm(str(tiny_model_dir))
    assert model.config.tie_word_embeddings
    assert saves_tied_weight(model, ["norm", "embed_tokens"]) and saves_tied_weight(model, ["model.embed_tokens"])
    assert not saves_tied_weight(model, ["norm"]) and not saves_tied_weight(model, [])


def test_engine_refuses_names_its_model_lacks(tiny_model_dir):
    engine = engine_for(tiny_model_dir, 2.0)
    engine.begin_weight_update()
    with pytest.raises(ValueError, match=r"disagree about model\.lora"):
        engine.load_weight_bucket([("model.extra.weight", torch.ones(32))])


def test_a_sync_that_did_not_arrive_stops_with_the_cause():
    adapters = [("m.q_proj.lora_A", torch.ones(2, 4)), ("m.q_proj.lora_B", torch.zeros(4, 2))]
    good = adapter_checksum(adapters)
    check_reports([(3, good), (3, good), (3, good)])
    tampered = adapter_checksum([(n, t + 1e-3) for n, t in adapters])
    assert tampered != good
    with pytest.raises(StaleWeights, match=r"rollout rank 1 \(weight-group rank 2\) holds version 2") as error:
        check_reports([(3, good), (3, good), (2, good)])
    assert "version 3" in str(error.value) and "stale" in str(error.value)
    with pytest.raises(StaleWeights, match=f"rollout rank 0 .* checksum {tampered}"):
        check_reports([(3, good), (3, tampered)])


@pytest.mark.parametrize("saved", [[], ["norm", "embed_tokens"]])
def test_checkpoint_is_an_adapter_folder_that_resumes_evaluates_and_exports(tiny_model_dir, tmp_path, saved):
    from agentrl.commands.export_merged import export_merged
    from agentrl.trainer.folders import check_model_folder
    from agentrl.trainer.model import load_policy

    trainer = trained(tiny_model_dir, run_dir=tmp_path / "run", steps=2, modules_to_save=saved)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    folder = checkpoint.save(tmp_path / "run", 2, trainer, tokenizer, keep=2)
    assert (folder / ADAPTER_CONFIG).is_file() and (folder / "adapter_model.safetensors").is_file()
    assert not (folder / "model.safetensors").exists()  # the frozen base is not copied
    recorded = json.loads((folder / ADAPTER_CONFIG).read_text())
    assert recorded["base_model_name_or_path"] == str(tiny_model_dir.resolve())
    assert checkpoint.latest(tmp_path / "run") == (2, folder)

    resumed = policy_trainer(
        lora_config(tiny_model_dir, tmp_path / "run", modules_to_save=saved), str(folder), "cpu"
    )  # what resume=true builds
    checkpoint.load_state(folder, resumed.optimizer, resumed.scheduler, resumed.model)
    for (name, mine), (_, theirs) in zip(trainer.named_weights(), resumed.named_weights(), strict=True):
        assert torch.equal(mine, theirs), name
    trainer.train_step(batch(7))
    resumed.train_step(batch(7))  # same adapters, same optimizer state: the same step
    for (name, mine), (_, theirs) in zip(trainer.named_weights(), resumed.named_weights(), strict=True):
        torch.testing.assert_close(mine, theirs, msg=name)

    check_model_folder(folder, str(folder))  # agentrl eval --checkpoint / agentrl serve accept it
    merged = load_causal_lm(str(folder))  # what they load: base + adapter, merged
    out = export_merged(str(tmp_path / "run"), str(tmp_path / "merged"))  # a run folder: its newest checkpoint
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not (out / ADAPTER_CONFIG).exists()
    plain = load_causal_lm(str(out))
    for (name, a), (_, b) in zip(plain.named_parameters(), merged.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    ids = torch.tensor([[1, 5, 9, 12]])
    reference = load_policy(str(folder), trainer.model_config, "float32", "cpu")  # the trainer's unmerged adapters
    torch.testing.assert_close(plain(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=1e-4, atol=1e-5)
    with pytest.raises(UserError, match="not empty"):
        export_merged(str(folder), str(out))


def test_an_adapter_whose_base_is_missing_names_the_fix(tiny_model_dir, tmp_path):
    from agentrl.trainer.folders import check_model_folder

    trainer = trained(tiny_model_dir, steps=0)
    folder = tmp_path / "adapter"
    trainer.model.save_pretrained(folder)
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config))
    for load in (lambda: load_causal_lm(str(folder)), lambda: check_model_folder(folder, str(folder))):
        with pytest.raises(UserError, match="which does not exist here") as error:
            load()
        assert "edit base_model_name_or_path" in str(error.value)


def test_resume_refuses_a_checkpoint_of_the_other_kind(tiny_model_dir, tmp_path):
    from agentrl.trainer.model import load_policy

    trainer = trained(tiny_model_dir, steps=0)
    folder = tmp_path / "adapter"
    trainer.model.save_pretrained(folder)
    plain = from_dict({"model": {"path": str(tiny_model_dir)}})
    with pytest.raises(UserError, match=r"model\.lora is not set"):
        load_policy(str(folder), plain.model, "float32", "cpu")
    with pytest.raises(UserError, match=r"full-model checkpoint but model\.lora is set"):
        load_policy(str(tmp_path), trainer.model_config, "float32", "cpu")


def test_a_relative_model_path_is_recorded_absolute(tiny_model_dir, tmp_path, monkeypatch):
    from agentrl.config.schema import LoraConfig
    from agentrl.trainer.lora import apply_lora

    monkeypatch.chdir(tiny_model_dir.parent)
    model = apply_lora(load_causal_lm(tiny_model_dir.name), LoraConfig(rank=2), tiny_model_dir.name)
    model.save_pretrained(tmp_path / "adapter")
    recorded = json.loads((tmp_path / "adapter" / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    assert recorded == str(tiny_model_dir.resolve())  # a checkpoint loads from any working directory


def test_sft_trains_adapters_and_its_final_model_is_merged(tiny_model_dir, tmp_path):
    from types import SimpleNamespace

    from agentrl.commands.sft import final_path, save_final
    from agentrl.sft.config import SFTConfig
    from agentrl.trainer.sft import SFTSections, SFTTrainer

    config = SFTConfig.model_validate(
        {
            "run_dir": str(tmp_path),
            "model": {"path": str(tiny_model_dir), "lora": {"rank": 4, "alpha": 8}},
            "sft": {"train": "t.jsonl", "batch_size": 4, "micro_batch_size": 4},
            "optimizer": {"lr": 0.05},
        }
    )
    trainer = SFTTrainer(str(tiny_model_dir), "cpu", 10, None, SFTSections.of(config))
    rows = [([1, 5, 9, 12, 7, 3], [0, 0, 1, 1, 1, 1]), ([2, 6, 8, 4], [0, 1, 1, 1])]
    losses = [trainer.train_step(rows)["sft/loss"] for _ in range(6)]
    assert losses[-1] < losses[0]
    assert all("lora_" in n for n, p in trainer.model.named_parameters() if p.requires_grad)
    ids = torch.tensor([[1, 5, 9, 12, 7, 3]])
    with torch.no_grad():
        adapted = trainer.model(input_ids=ids).logits
    save_final(tmp_path, SimpleNamespace(model=trainer.model), load_tokenizer(str(tiny_model_dir)), leader=True)
    final = final_path(tmp_path)
    assert (final / "config.json").is_file() and not (final / ADAPTER_CONFIG).exists()  # an RL model.path
    torch.testing.assert_close(load_causal_lm(str(final))(input_ids=ids).logits, adapted, rtol=1e-4, atol=1e-5)


def test_sglang_gets_each_version_as_a_peft_folder_that_peft_loads(tiny_model_dir, tmp_path):
    from peft import PeftModel

    from agentrl.engine.sglang_lora import write_adapter_folder

    trainer = trained(tiny_model_dir, steps=2)
    folder = write_adapter_folder(tmp_path / "v2", trainer.named_weights(), trainer.model_config.lora, "base")
    loaded = PeftModel.from_pretrained(load_causal_lm(str(tiny_model_dir)), str(folder))
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits)
