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


# --- LoRA policies on one shared base ------------------------------------------------------------------------------

LORA = {"model.lora": "{rank: 4, alpha: 8}"}


def adapters(run, policy: str, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "policies" / policy / "checkpoints" / f"step_{step:06d}" / "adapter_model.safetensors")


@pytest.mark.timeout(900)  # two jobs of three ranks: about 2 min each on the shared machine under a load of 40
def test_two_lora_policies_on_one_base_both_train_and_resume_their_adapters(tmp_path, tiny_model_dir):
    from agentrl.config import load_config
    from agentrl.roles.policy_training import make_side
    from agentrl.trainer.lora import adapter_weights

    overrides = small(tmp_path, tiny_model_dir, steps=2, **LORA, **{"checkpoint.every": 1, "optimizer.lr": 0.05,
                      "policies.solver.optimizer.lr": 0.05, "algorithm.name": "rloo",
                      "algorithm.entropy_floor": "null"})  # fmt: skip
    result = job(3, RELAY, overrides, timeout=420)
    assert_ok(result)
    assert "proposer, solver share one base on each rollout rank" in result.stdout
    run = tmp_path / "run"
    trained = {policy: adapters(run, policy, 2) for policy in ("proposer", "solver")}
    sizes = {}
    for policy, tensors in trained.items():
        logged = scalars(run / "policies" / policy)
        assert [s for s, _ in logged["episode/count"]] == [0, 1]
        assert all(v < 1e-4 for _, v in logged["train/logprob_diff_vs_rollout"])  # the engine ran its adapter
        assert all(v == 0 for _, v in logged["episode/weight_lag_mean"])
        assert any(t.abs().sum() > 0 for name, t in tensors.items() if "lora_B" in name)  # B moved off zero: trained
        sizes[policy] = sum(t.numel() * t.element_size() for t in tensors.values())
        assert sizes[policy] < 0.25 * (tiny_model_dir / "model.safetensors").stat().st_size  # not the base
    logged = scalars(run / "policies" / "solver")
    for policy in ("proposer", "solver"):  # each step, each policy's engine took its adapter and nothing more
        assert [v for _, v in logged[f"weights/adapter_bytes_in/{policy}"]] == [sizes[policy]] * 2
    assert any(not torch.equal(trained["proposer"][n], trained["solver"][n]) for n in trained["solver"])

    resumed = job(3, RELAY, {**overrides, "steps": 3, "resume": "true"}, timeout=420)
    assert_ok(resumed)
    assert "resuming policies proposer, solver from step 2" in resumed.stdout
    config = load_config(RELAY, [f"{k}={v}" for k, v in {**overrides, "steps": 3, "resume": "true"}.items()])
    for policy in ("proposer", "solver"):
        # the trainer ranks rebuild each policy this way: its adapters are the step-2 checkpoint's
        side = make_side(config, policy, "cpu", None, None, 2, False)
        held = {name.replace(".lora_A", ".lora_A.weight").replace(".lora_B", ".lora_B.weight"): t for name, t in
                adapter_weights(side.trainer.model)}  # fmt: skip
        saved = {name.removeprefix("base_model.model."): t for name, t in trained[policy].items()}
        assert held.keys() == saved.keys() and all(torch.equal(held[n], saved[n]) for n in saved)
        logged = scalars(run / "policies" / policy)
        assert [s for s, _ in logged["episode/count"]] == [0, 1, 2]
        assert logged["train/logprob_diff_vs_rollout"][-1][1] < 1e-4  # the engine served the restored adapter
        assert not torch.equal(
            adapters(run, policy, 3)["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"],
            trained[policy]["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"],
        )


@pytest.mark.timeout(600)
def test_a_fixed_lora_policy_on_a_shared_base_takes_no_bytes(tmp_path, tiny_model_dir):
    overrides = small(tmp_path, tiny_model_dir, steps=2, **LORA, **{"layout.trainer": 1,
                      "policies.solver.train": "false", "policies.solver.trainers": 0})  # fmt: skip
    result = job(2, RELAY, overrides, timeout=420)
    assert_ok(result)
    assert "solver is fixed (never syncs)" in result.stdout and "proposer, solver share one base" in result.stdout
    logged = scalars(tmp_path / "run" / "policies" / "proposer")
    assert [v for _, v in logged["weights/adapter_bytes_in/solver"]] == [0.0, 0.0]
    assert all(v > 0 for _, v in logged["weights/adapter_bytes_in/proposer"])
