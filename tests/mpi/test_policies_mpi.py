"""Real `mpirun` jobs of several policies: two policies on trainer ranks of their own, a fixed policy that never
syncs, and a self-play resume that restores every policy, the opponent pool and the Elo ratings."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tests.mpi.helpers import assert_ok, mpirun, scalars

pytestmark = pytest.mark.mpi

RELAY = str(ROOT / "launch" / "configs" / "relay_coop.yaml")
NIM = str(ROOT / "launch" / "configs" / "nim_selfplay.yaml")


def job(n: int, config: str, overrides: dict, timeout: float = 300):
    return mpirun(n, ["-m", "agentrl.cli", "train", config, *(f"{k}={v}" for k, v in overrides.items())], timeout)


def small(tmp_path, model_dir, **extra) -> dict:
    return {
        "run_dir": tmp_path / "run",
        "model.path": model_dir,
        "steps": 3,
        "rollout.tasks_per_step": 4,
        "rollout.group_size": 4,
        "logging.progress": "false",
        **extra,
    }


def weights(run, policy: str, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "policies" / policy / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


def test_two_policies_train_on_their_own_ranks(tmp_path, tiny_model_dir):
    # the entropy bonus without a floor moves every policy even in steps where no game was won
    overrides = small(tmp_path, tiny_model_dir, **{"algorithm.name": "rloo", "algorithm.entropy_floor": "null"})
    assert_ok(job(3, RELAY, overrides))  # trainer ranks 0 (proposer), 1 (solver); rollout rank 2
    run = tmp_path / "run"
    initial = load_file(tiny_model_dir / "model.safetensors")
    trained = {}
    for policy in ("proposer", "solver"):
        logged = scalars(run / "policies" / policy)
        assert [s for s, v in logged["episode/count"]] == [0, 1, 2]
        assert all(v == 16 for _, v in logged["episode/count"])  # 4 tasks x 4 games, one seat each
        assert all(v == 0 for _, v in logged["episode/weight_lag_mean"])  # each engine held its policy's version
        assert logged["train/logprob_diff_vs_rollout"][0][1] < 1e-4  # the engine served this policy's weights
        trained[policy] = weights(run, policy, 3)
    assert any(not torch.equal(trained["proposer"][name], trained["solver"][name]) for name in initial)
    assert any(not torch.equal(initial[name], trained["solver"][name]) for name in initial)


def test_a_fixed_policy_plays_and_never_trains_nor_syncs(tmp_path, tiny_model_dir):
    overrides = small(tmp_path, tiny_model_dir, **{"layout.trainer": 1, "policies.solver.train": "false",
                                                   "policies.solver.trainers": 0})  # fmt: skip
    result = job(2, RELAY, overrides)
    assert_ok(result)
    run = tmp_path / "run"
    assert not (run / "policies" / "solver").exists()  # nothing of it trains, saves or moves
    logged = scalars(run / "policies" / "proposer")
    assert [s for s, _ in logged["episode/count"]] == [0, 1, 2]
    assert "game/reward_mean/solver" in logged  # the fixed policy played every game


def test_self_play_resume_restores_the_policy_the_pool_and_the_ratings(tmp_path, tiny_model_dir):
    first = small(tmp_path, tiny_model_dir, steps=2, **{"checkpoint.every": 1, "game.pool.every": 1,
                                                        "game.evaluate.games": 4})  # fmt: skip
    assert_ok(job(2, NIM, first))
    learner = tmp_path / "run" / "policies" / "nim"
    # versions 0 and 1 were served (version 2, after the last step, was never sent)
    assert sorted(p.name for p in (learner / "pool").iterdir()) == ["step_000000.pt", "step_000001.pt"]
    saved = json.loads((learner / "checkpoints" / "step_000002" / "ratings.json").read_text())
    assert {"learner", "step_000000", "step_000001"} <= set(saved)
    refused = job(2, NIM, {**first, "steps": 4})
    assert refused.returncode != 0 and "resume=true" in refused.stdout + refused.stderr
    result = job(2, NIM, {**first, "steps": 4, "resume": "true", "game.pool.size": 5})
    assert_ok(result)
    assert "resuming policies nim from step 2" in result.stdout
    logged = scalars(learner)
    assert [s for s, _ in logged["episode/count"]] == [0, 1, 2, 3]
    # snapshots 0 and 1 were taken by the first job only: games against them after the resume come from the pool
    # restored from run_dir
    restored = [tag for tag in logged if tag.startswith("game/games_vs/step_00000") and tag[-1] in "01"]
    assert any(step >= 2 for tag in restored for step, _ in logged[tag]), sorted(logged)
    # the Elo ratings continued from the checkpoint: each snapshot rated at step 2 is still rated at step 4
    resumed = json.loads((learner / "checkpoints" / "step_000004" / "ratings.json").read_text())
    assert set(saved) <= set(resumed) and {"step_000002", "step_000003"} <= set(resumed)
    assert sorted(p.name for p in (learner / "pool").iterdir())[-2:] == ["step_000002.pt", "step_000003.pt"]
