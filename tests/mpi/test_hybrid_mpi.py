"""`mpirun -n 2 agentrl train` with layout.hybrid: each rank generates half of a step's tasks and trains on them,
data parallel; the leader logs every rank's episodes, evaluates on both ranks' shares, checkpoints and resumes."""

import json

import pytest

from tests.mpi.helpers import QUICKSTART, assert_ok, mpirun, scalars, small_run, train

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]

HYBRID = {"layout.trainer": 2, "layout.rollout": 2, "layout.hybrid": "true"}
EVAL = {"eval.every": 2, "eval.seeds": "[100,6]", "eval.n": 2, "eval.temperature": 1.0}


def test_two_hybrid_ranks_train_evaluate_checkpoint_and_resume(tmp_path, tiny_model_dir):
    first = train(2, small_run(tmp_path, tiny_model_dir, steps=4, **HYBRID, **EVAL, **{"checkpoint.every": 2}))
    assert_ok(first)
    assert "hybrid" in first.stdout  # the placement table
    run = tmp_path / "run"
    logged = scalars(run)
    assert [step for step, _ in logged["episode/count"]] == [0, 1, 2, 3]
    assert all(count == 16 for _, count in logged["episode/count"])  # 4 tasks x 4 episodes over the two ranks
    assert all(value == 0 for _, value in logged["episode/weight_lag_mean"])  # on-policy: this step's weights
    # each rank's engine holds its trainer's weights: the recomputed log-probs are the engine's
    assert all(value < 1e-4 for _, value in logged["train/logprob_diff_vs_rollout"])
    assert all(value == 4 for _, value in logged["rollout/generated_groups"])  # both ranks' groups, merged
    assert all(value == 2 for _, value in logged["rollout/rank_groups_max"])  # half each
    for key in ("time/generate", "time/train", "train/loss", "perf/tokens_per_s"):
        assert key in logged, key
    assert [step for step, _ in logged["eval/success"]] == [2, 4]
    report = json.loads((run / "eval" / "step_000004.json").read_text())
    assert report["rollout_ranks"] == 2 and len(report["tasks"]) == 6  # both ranks' shares of the split

    # `agentrl eval` on hybrid ranks: each evaluates its share; the same episodes as the run's own evaluation
    out = tmp_path / "eval_out"
    args = [QUICKSTART, "--checkpoint", str(run / "checkpoints" / "step_000004"), "--out", str(out)]
    args += small_run(tmp_path, tiny_model_dir, **HYBRID, **EVAL)
    assert_ok(mpirun(2, ["-m", "agentrl.cli", "eval", *args], 300))
    evaluated = json.loads((out / "report.json").read_text())
    assert [task["rewards"] for task in evaluated["tasks"]] == [task["rewards"] for task in report["tasks"]]

    resumed = train(2, small_run(tmp_path, tiny_model_dir, steps=6, resume="true", **HYBRID, **{"checkpoint.every": 2}))
    assert_ok(resumed)
    assert "resuming from" in resumed.stdout and "step_000004" in resumed.stdout
    steps = [step for step, _ in scalars(run)["episode/count"]]
    assert sorted(steps) == [0, 1, 2, 3, 4, 5]  # no step lost or repeated
    assert (run / "checkpoints" / "step_000006" / "model.safetensors").is_file()


@pytest.mark.parametrize("extra", [{}, {"parallelism.fsdp": "true"}], ids=["replicas", "fsdp"])
def test_hybrid_ranks_train_as_the_split_layout_of_as_many_trainer_and_rollout_ranks(tmp_path, tiny_model_dir, extra):
    # Rollout rank i's engine seed and share of tasks, and the shards dealt to the trainers, are the same either way;
    # under FSDP each hybrid rank's engine gathers the whole weights from the shards.
    hybrid = small_run(tmp_path, tiny_model_dir, run_dir=tmp_path / "hybrid", **HYBRID, **extra)
    two_and_two = {"layout.trainer": 2, "layout.rollout": 2}
    split = small_run(tmp_path, tiny_model_dir, run_dir=tmp_path / "split", **two_and_two, **extra)
    assert_ok(train(2, hybrid))
    assert_ok(train(4, split))
    on_hybrid, on_split = scalars(tmp_path / "hybrid"), scalars(tmp_path / "split")
    for tag in ("episode/reward_mean", "episode/count", "train/loss", "train/grad_norm", "train/entropy"):
        assert [step for step, _ in on_hybrid[tag]] == [0, 1, 2]
        assert [value for _, value in on_hybrid[tag]] == pytest.approx([value for _, value in on_split[tag]], rel=1e-5)
