"""An optimizer update whose loss or gradient norm is not finite is skipped whole (weights, optimizer and scheduler
state bit-identical), counted in train/skipped_nonfinite, and trainer.max_skipped_nonfinite in a row stop the run."""

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from agentrl.config import from_dict
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer.nonfinite import NonFiniteUpdates
from agentrl.trajectory import pack
from tests.conftest import ROOT
from tests.unit.test_parallel import synthetic_batch
from tests.unit.test_ppo import critic_weights, multi_turn_batch


def trainer_for(model_dir, algorithm="grpo", **trainer):
    config = from_dict(
        {
            "model": {"path": str(model_dir)},
            "algorithm": {"name": algorithm},
            "trainer": {"micro_batch_size": 3, **trainer},
            "optimizer": {"lr": 1e-2},
            "lr_scheduler": {"warmup_steps": 5},  # the LR moves every optimizer step: a stray scheduler step shows
        }
    )
    return policy_trainer(config, str(model_dir), "cpu")


def poisoned(batch: dict) -> dict:
    """The batch with a NaN reward in its first episode: the advantages of its group, then the loss, go NaN."""
    batch = {key: value.copy() for key, value in batch.items()}
    batch["reward"][0] = np.nan
    if len(batch["turn_reward"]):
        batch["turn_reward"][0] = np.nan
    return batch


def snapshot(trainer) -> dict:
    """Everything a skipped update must leave as it was, copied."""
    return {
        "policy": [p.detach().clone() for p in trainer.params],
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "scheduler": copy.deepcopy(trainer.scheduler.state_dict()),
        "extras": [
            ({n: t.detach().clone() for n, t in e.module.state_dict().items()}, copy.deepcopy(e.optimizer.state_dict()))
            for e in trainer.extras
        ],
    }


def assert_identical(a, b, where="") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) and a.dtype == b.dtype, where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_nan_loss_leaves_weights_and_optimizer_state_bit_identical(tiny_model_dir, algorithm, capsys):
    trainer = trainer_for(tiny_model_dir, algorithm)
    batch = synthetic_batch if algorithm == "grpo" else lambda vocab, seed: multi_turn_batch(seed)
    vocab = trainer.model.config.vocab_size
    first = trainer.train_step(batch(vocab, 0))  # AdamW has moments and a step count to keep
    assert first["train/skipped_nonfinite"] == 0.0 and np.isfinite(first["train/loss"])
    before = snapshot(trainer)
    metrics = trainer.train_step(poisoned(batch(vocab, 1)))
    assert metrics["train/skipped_nonfinite"] == 1.0
    assert not np.isfinite(metrics["train/loss"])
    assert_identical(before, snapshot(trainer))
    assert all(p.grad is None for p in trainer.params)
    assert "skipped an optimizer update whose loss nan" in capsys.readouterr().err
    after = trainer.train_step(batch(vocab, 2))  # the next finite batch trains as usual
    assert after["train/skipped_nonfinite"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before["policy"], trainer.params, strict=True))
    if algorithm == "ppo":
        moved = critic_weights(trainer)
        assert any(not torch.equal(t, before["extras"][0][0][n]) for n, t in moved.items())


def test_a_gradient_norm_that_is_not_finite_skips_the_update_though_the_loss_is_finite(tiny_model_dir):
    trainer = trainer_for(tiny_model_dir)
    vocab = trainer.model.config.vocab_size
    trainer.train_step(synthetic_batch(vocab, 0))
    before = snapshot(trainer)
    hook = trainer.params[-1].register_hook(lambda grad: grad * float("inf"))
    metrics = trainer.train_step(synthetic_batch(vocab, 1))
    hook.remove()
    assert np.isfinite(metrics["train/loss"]) and not np.isfinite(metrics["train/grad_norm"])
    assert metrics["train/skipped_nonfinite"] == 1.0
    assert_identical(before, snapshot(trainer))


def test_updates_skipped_in_a_row_stop_the_run_naming_the_setting(tiny_model_dir):
    trainer = trainer_for(tiny_model_dir, updates_per_step=2, max_skipped_nonfinite=3)
    vocab = trainer.model.config.vocab_size
    nan_batch = poisoned(synthetic_batch(vocab, 0))
    nan_batch["reward"][:] = np.nan  # both mini-batches' groups
    assert trainer.train_step(nan_batch)["train/skipped_nonfinite"] == 2.0
    assert trainer.train_step(synthetic_batch(vocab, 1))["train/skipped_nonfinite"] == 0.0  # a finite one resets
    assert trainer.train_step(nan_batch)["train/skipped_nonfinite"] == 2.0
    before = snapshot(trainer)
    with pytest.raises(NonFiniteUpdates, match=r"3 optimizer updates in a row .* trainer\.max_skipped_nonfinite=3"):
        trainer.train_step(nan_batch)
    assert_identical(before, snapshot(trainer))


def test_without_a_limit_it_skips_and_goes_on(tiny_model_dir):
    trainer = trainer_for(tiny_model_dir, max_skipped_nonfinite=None)
    nan_batch = poisoned(synthetic_batch(trainer.model.config.vocab_size, 0))
    assert [trainer.train_step(nan_batch)["train/skipped_nonfinite"] for _ in range(4)] == [1.0] * 4


def test_an_empty_batch_is_no_skip(tiny_model_dir):
    trainer = trainer_for(tiny_model_dir, max_skipped_nonfinite=1)
    assert trainer.train_step(pack([]))["train/skipped_nonfinite"] == 0.0


def test_a_run_whose_updates_are_all_nan_stops_with_the_message_and_keeps_its_weights(tiny_model_dir, tmp_path):
    """`agentrl train` (world size 1) with an algorithm whose every loss is NaN: two skipped updates, then exit 2
    naming trainer.max_skipped_nonfinite; the engine sampled the untouched weights all along (no episode failed)."""
    run_dir = tmp_path / "run"
    overrides = [
        f"run_dir={run_dir}",
        "steps=6",
        f"model.path={tiny_model_dir}",
        "algorithm.name=tests.unit.nan_algorithm:NaNAdvantage",
        "trainer.max_skipped_nonfinite=2",
        "rollout.tasks_per_step=2",
        "rollout.group_size=4",
        "eval.every=0",
        "logging.progress=false",
    ]
    command = [sys.executable, "-m", "agentrl.cli", "train", "launch/configs/quickstart.yaml", *overrides]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "2 optimizer updates in a row had a loss or gradient norm that is not finite" in result.stderr
    assert "stopping at trainer.max_skipped_nonfinite=2" in result.stderr
    assert result.stderr.count("skipped an optimizer update whose loss nan") == 1  # the first; the second stops
    assert "failed with the same error" not in result.stderr
    assert not (run_dir / "checkpoints").exists()
