"""PPO's critic under mpirun: two trainer ranks (replicas, or FSDP2 shards) equal one rank on the whole batch,
and the critic's checkpoint resumes identically."""

import pytest

from tests.mpi.helpers import assert_ok, on_cpu_below_gpus, script

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("flags", [(), ("fsdp",)], ids=["replicas", "fsdp"])
def test_ppo_on_two_ranks_equals_one_rank_on_the_whole_batch(tmp_path, tiny_model_dir, flags, monkeypatch):
    on_cpu_below_gpus(2, monkeypatch)  # a CPU script: nothing in it may pick a GPU up
    result = script(2, "ppo_equivalence.py", str(tiny_model_dir), str(tmp_path), *flags, timeout=180)
    assert_ok(result)
    assert "2 ranks == 1 rank on the whole batch (policy and critic)" in result.stdout
    assert "the critic checkpoint resumes identically" in result.stdout


def test_ppo_train_run_logs_critic_metrics_and_resumes(tmp_path, tiny_model_dir):
    from tests.mpi.helpers import scalars, small_run, train

    ppo = {"algorithm.name": "ppo", "checkpoint.every": 1, "layout.trainer": 2, "layout.rollout": 1}
    assert_ok(train(3, small_run(tmp_path, tiny_model_dir, steps=2, **ppo)))
    run = tmp_path / "run"
    critic = run / "checkpoints" / "step_000002" / "critic"
    assert (critic / "model.safetensors").is_file() and (critic / "optimizer.pt").is_file()
    assert_ok(train(3, small_run(tmp_path, tiny_model_dir, steps=3, resume="true", **ppo)))
    logged = scalars(run)
    for key in ("value_loss", "explained_variance", "value_mean", "return_mean", "value_clip_frac", "critic_grad_norm"):
        assert sorted(s for s, _ in logged[f"train/{key}"]) == [0, 1, 2], key
    assert logged["train/value_mean"][0][1] == 0.0  # the value head starts at zero
    assert (run / "checkpoints" / "step_000003" / "critic" / "model.safetensors").is_file()
