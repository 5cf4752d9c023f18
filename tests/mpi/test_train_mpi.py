"""Real `mpirun -n 2..4 agentrl train` jobs on the tiny model: rewards, weight versions, resume, aborts."""

import time

import pytest
import yaml

from tests.mpi.helpers import assert_ok, scalars, small_run, train

pytestmark = pytest.mark.mpi


def test_end_to_end_four_ranks(tmp_path, tiny_model_dir):
    result = train(4, small_run(tmp_path, tiny_model_dir, **{"layout.env": 1, "layout.rollout": 2}))
    assert_ok(result)
    run = tmp_path / "run"
    logged = scalars(run)
    assert [s for s, _ in logged["episode/reward_mean"]] == [0, 1, 2]
    assert all(0.0 <= v <= 1.0 for _, v in logged["episode/reward_mean"])
    assert all(v == 16 for _, v in logged["episode/count"])  # 4 tasks x 4 episodes, none lost
    assert all(v == 0 for _, v in logged["episode/failed"])
    assert all(v == 0 for _, v in logged["episode/weight_lag_mean"])  # rollouts held the trainer's version
    # Same weights, same tokens: the trainer's recomputed logprobs match the engine's.
    assert logged["train/logprob_diff_vs_rollout"][0][1] < 1e-4
    for key in ("time/generate", "time/env", "time/train", "time/weight_sync", "perf/tokens_per_s", "train/entropy"):
        assert key in logged, key
    assert (run / "checkpoints" / "step_000003" / "model.safetensors").is_file()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["layout"] == {"trainer": 1, "rollout": 2, "env": 1, "scorer": 0, "colocate": False, "hybrid": False}


def test_resume_continues_at_the_right_step(tmp_path, tiny_model_dir):
    first = small_run(tmp_path, tiny_model_dir, steps=2, **{"checkpoint.every": 1})
    assert_ok(train(2, first))
    run = tmp_path / "run"
    assert (run / "checkpoints" / "step_000002").is_dir()
    refused = train(2, small_run(tmp_path, tiny_model_dir, steps=4))
    assert refused.returncode != 0 and "resume=true" in refused.stderr + refused.stdout
    assert_ok(train(2, small_run(tmp_path, tiny_model_dir, steps=4, resume="true", **{"checkpoint.every": 1})))
    steps = sorted(s for s, _ in scalars(run)["episode/reward_mean"])
    assert steps == [0, 1, 2, 3]  # no step lost or repeated across the two runs
    assert (run / "checkpoints" / "step_000004").is_dir()
    assert not (run / "checkpoints" / "step_000001").exists()  # keep=2


def test_two_trainer_ranks_with_kl_and_micro_batches(tmp_path, tiny_model_dir):
    layout = {"layout.trainer": 2, "layout.rollout": 1, "layout.env": 1}
    algorithm = {"algorithm.kl_coef": 0.05, "trainer.micro_batch_size": 3, "trainer.updates_per_step": 2}
    assert_ok(train(4, small_run(tmp_path, tiny_model_dir, **layout, **algorithm)))
    logged = scalars(tmp_path / "run")
    assert len(logged["train/loss"]) == 3
    assert all(v >= 0 for _, v in logged["train/kl"])
    assert logged["train/kl"][-1][1] > 0  # the policy moved away from the reference
    assert all(v >= 0 for _, v in logged["time/transfer"])


def test_failing_rank_aborts_the_job(tmp_path, tiny_model_dir):
    # The rollout rank cannot build its engine while the trainer waits to broadcast weights.
    started = time.monotonic()
    result = train(2, small_run(tmp_path, tiny_model_dir, **{"rollout.engine.backend": "sglang"}), timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "uncaught exception, aborting the job" in result.stderr
    assert "rollout.engine.backend=sglang needs SGLang: pip install 'agentrl[sglang]'" in result.stderr
    assert elapsed < 60


def test_layout_that_does_not_fit_is_an_error(tmp_path, tiny_model_dir):
    result = train(3, small_run(tmp_path, tiny_model_dir, **{"layout.env": 1, "layout.rollout": 2}), timeout=120)
    assert result.returncode != 0
    assert "layout needs 4 ranks" in result.stderr and "the job has 3" in result.stderr
