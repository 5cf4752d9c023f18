"""FSDP2 on CPU (gloo) under mpirun: sharded training equals whole-batch training, checkpoints are
HF folders that resume exactly, and rollout ranks get the gathered weights bucket by bucket."""

import pytest

from tests.mpi.helpers import assert_ok, on_cpu_below_gpus, scalars, script, small_run, train

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(
    "flags",
    [(), ("activation_checkpointing", "kl"), ("bf16",)],
    ids=["fp32", "activation_checkpointing+kl", "bf16"],
)
def test_two_sharded_ranks_equal_one_rank_on_the_whole_batch(tmp_path, tiny_model_dir, flags):
    result = script(2, "fsdp_equivalence.py", str(tiny_model_dir), str(tmp_path), *flags, timeout=90)
    assert_ok(result)
    assert "2 sharded ranks == 1 rank on the whole batch" in result.stdout
    assert "resume continues identically" in result.stdout


def test_bucketed_sync_gathers_one_bucket_at_a_time(tmp_path):
    result = script(3, "fsdp_weight_sync.py", str(tmp_path / "model"), timeout=90)
    assert_ok(result)
    assert "rollout rank holds the gathered weights" in result.stdout


def test_fsdp_train_run_checkpoints_and_resumes(tmp_path, tiny_model_dir, monkeypatch):
    on_cpu_below_gpus(2, monkeypatch)
    from transformers import AutoModelForCausalLM

    layout = {"layout.trainer": 2, "layout.rollout": 1, "layout.env": 0, "parallelism.fsdp": "true"}
    first = small_run(tmp_path, tiny_model_dir, steps=2, **{"checkpoint.every": 1}, **layout)
    assert_ok(train(3, first, timeout=120))
    run = tmp_path / "run"
    logged = scalars(run)
    assert [s for s, _ in logged["episode/reward_mean"]] == [0, 1]
    assert all(v == 16 for _, v in logged["episode/count"])
    # The rollout engine sampled with the weights the sharded trainer gathered and sent.
    assert all(v < 1e-4 for _, v in logged["train/logprob_diff_vs_rollout"])
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000002")
    assert model.config.vocab_size > 0
    resumed = small_run(tmp_path, tiny_model_dir, steps=3, resume="true", **{"checkpoint.every": 1}, **layout)
    assert_ok(train(3, resumed, timeout=120))
    logged = scalars(run)
    assert sorted(s for s, _ in logged["episode/reward_mean"]) == [0, 1, 2]
    assert logged["train/logprob_diff_vs_rollout"][-1][1] < 1e-4
    assert (run / "checkpoints" / "step_000003" / "model.safetensors").is_file()
