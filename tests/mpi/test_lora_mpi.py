"""A real `mpirun -n 4 agentrl train` with model.lora (adapters, and the norms trained whole): adapter-only syncs
over shm, then a resume over mpi."""

import json

import pytest

from tests.mpi.helpers import assert_ok, on_cpu_below_gpus, scalars, small_run, train

pytestmark = pytest.mark.mpi
pytest.importorskip("peft")


def test_lora_trains_checkpoints_adapters_and_resumes(tmp_path, tiny_model_dir):
    lora = {"model.lora.rank": 4, "model.lora.alpha": 8, "model.lora.modules_to_save": "[norm]", "optimizer.lr": 0.05}
    lora["checkpoint.every"] = 1
    layout = {"layout.env": 1, "layout.rollout": 2}
    assert_ok(train(4, small_run(tmp_path, tiny_model_dir, steps=2, **layout, **lora)))
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_000002"
    assert (step / "adapter_model.safetensors").is_file() and not (step / "model.safetensors").exists()
    recorded = json.loads((step / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] == str(tiny_model_dir.resolve())
    assert recorded["r"] == 4 and recorded["lora_alpha"] == 8 and recorded["modules_to_save"] == ["norm"]

    resumed = {**lora, "weights.transport": "mpi", "resume": "true"}
    assert_ok(train(4, small_run(tmp_path, tiny_model_dir, steps=4, **layout, **resumed)))
    logged = scalars(run)
    assert [s for s, _ in logged["episode/reward_mean"]] == [0, 1, 2, 3]  # no step lost or repeated
    assert all(v == 16 for _, v in logged["episode/count"])
    assert all(v == 0 for _, v in logged["episode/weight_lag_mean"])  # every engine held the trainer's version
    # The engines generate from base + merged adapters: the trainer's own log-probs of their tokens match theirs,
    # at every step, so each version's adapters arrived and were merged from the base (a stale or doubly merged
    # adapter would differ once the adapters moved).
    assert all(v < 1e-4 for _, v in logged["train/logprob_diff_vs_rollout"]), logged["train/logprob_diff_vs_rollout"]
    assert logged["train/grad_norm"][-1][1] > 0
    assert (run / "checkpoints" / "step_000004" / "adapter_model.safetensors").is_file()


def test_two_trainer_ranks_replicated_or_sharded_train_the_adapters_of_one_rank(tmp_path, tiny_model_dir, monkeypatch):
    """Fresh adapters are random: every trainer rank must start from the same ones, or replicas drift apart and
    FSDP shards stitch together different draws. Two ranks, replicated or sharded, train what one rank trains on
    the whole batch; the sharded run then resumes from its adapter checkpoint."""
    on_cpu_below_gpus(2, monkeypatch)
    from safetensors.torch import load_file

    saved = "[norm, embed_tokens]"  # the tied embedding too: one copy, also the head, on every rank and shard
    lora = {"model.lora.rank": 4, "model.lora.alpha": 8, "model.lora.modules_to_save": saved, "optimizer.lr": 0.05}
    common = {"layout.rollout": 1, "layout.env": 0, "checkpoint.every": 1, **lora}
    sharded = {**common, "layout.trainer": 2, "parallelism.fsdp": "true"}
    runs = {"one": tmp_path / "one", "replicated": tmp_path / "replicated", "sharded": tmp_path / "sharded"}
    assert_ok(train(2, small_run(runs["one"], tiny_model_dir, steps=2, **common)))
    assert_ok(train(3, small_run(runs["replicated"], tiny_model_dir, steps=2, **common, **{"layout.trainer": 2})))
    assert_ok(train(3, small_run(runs["sharded"], tiny_model_dir, steps=2, **sharded)))
    logged = {name: scalars(path / "run") for name, path in runs.items()}

    def adapters(name):
        return load_file(runs[name] / "run" / "checkpoints" / "step_000002" / "adapter_model.safetensors")

    reference = adapters("one")
    for name in ("replicated", "sharded"):
        assert logged[name]["episode/reward_mean"] == logged["one"]["episode/reward_mean"], name
        pairs = zip(logged[name]["train/grad_norm"], logged["one"]["train/grad_norm"], strict=True)
        for (step, got), (_, want) in pairs:
            assert abs(got - want) <= 1e-5 * want, (name, step, got, want)
        assert all(v < 1e-4 for _, v in logged[name]["train/logprob_diff_vs_rollout"]), name
        trained = adapters(name)  # gathered whole from the shards, in PEFT's own names
        assert sorted(trained) == sorted(reference)
        embedding, head = (next(v for k, v in trained.items() if part in k) for part in ("embed_tokens", "lm_head"))
        assert (embedding == head).all(), name  # still tied after training
        # Measured up to 7e-5 apart after 2 steps at lr 0.05 (float32 sums in another order; Adam's first steps
        # scale small gradients up); adapters drawn apart, the defect this guards against, differed by 0.36.
        assert max((trained[k] - reference[k]).abs().max().item() for k in reference) < 1e-3, name

    resumed = train(3, small_run(runs["sharded"], tiny_model_dir, steps=3, resume="true", **sharded))
    assert_ok(resumed)
    assert "resumed at step 2" in resumed.stdout
    logged = scalars(runs["sharded"] / "run")
    assert [s for s, _ in logged["train/grad_norm"]] == [0, 1, 2]
    assert logged["train/logprob_diff_vs_rollout"][-1][1] < 1e-4  # the resumed adapters reached the engine
