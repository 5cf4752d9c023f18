"""`optimizer.fused`: torch's fused AdamW where it has the kernel; the same training up to float rounding; checkpoints
resume across the choice (a run keeps its own kernel, whatever the saving run used)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.config import from_dict
from agentrl.models.loading import load_tokenizer
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer import checkpoint
from agentrl.trainer.optim import build_optimizer
from tests.unit.test_shared_prefix import make_batch


def trainer_for(model_dir, fused):
    config = from_dict(
        {
            "model": {"path": str(model_dir)},
            "rollout": {"group_size": 8},
            "trainer": {"micro_batch_size": 32},
            "optimizer": {"lr": 1e-2, "fused": fused},
        }
    )
    return policy_trainer(config, str(model_dir), "cpu")


def test_auto_fuses_where_torch_has_the_kernel_and_true_refuses_where_it_has_none():
    section = from_dict({"model": {"path": "m"}}).optimizer
    on_cpu = [torch.nn.Parameter(torch.zeros(3))]
    assert section.fused == "auto" and build_optimizer(on_cpu, section).param_groups[0]["fused"] is True
    assert build_optimizer(on_cpu, section.model_copy(update={"fused": False})).param_groups[0]["fused"] is None
    on_meta = [torch.nn.Parameter(torch.zeros(3, device="meta"))]  # a device torch has no fused AdamW for
    assert build_optimizer(on_meta, section).param_groups[0]["fused"] is None
    with pytest.raises(ValueError, match=r"optimizer.fused=true.*float32 on meta.*set optimizer.fused=auto"):
        build_optimizer(on_meta, section.model_copy(update={"fused": True}))
    with pytest.raises(ValueError, match=r"optimizer\.fused"):
        from_dict({"model": {"path": "m"}, "optimizer": {"fused": "sometimes"}})


def test_fused_trains_as_the_loop_does_and_resumes_across_the_choice(tiny_model_dir, tmp_path):
    """Three steps each way give the same weights up to float rounding (Adam's normalised steps carry a last-bit
    difference on to near-zero gradients: within 1e-4 of the distance the weights moved); a checkpoint of the
    unfused run resumes fused (and back), its moments and step count carried over, and the next step matches the run
    that went on."""
    batches = [make_batch(1, 8, seed=seed) for seed in range(4)]
    trainers = {}
    for fused in (True, False):
        torch.manual_seed(0)
        trainers[fused] = trainer_for(tiny_model_dir, fused)
        assert trainers[fused].optimizer.param_groups[0]["fused"] is (True if fused else None)
        for batch in batches[:3]:
            trainers[fused].train_step(batch)
    pairs = [(a.detach(), b.detach()) for a, b in zip(trainers[True].params, trainers[False].params, strict=True)]
    moved = 3 * 1e-2  # AdamW moves a weight by about lr a step; measured: the two differ by under 1e-6
    for a, b in pairs:
        assert float((a - b).abs().max()) <= 1e-4 * moved
    assert any(not torch.equal(a, b) for a, b in pairs)  # fused rounds differently: not a silent fallback
    tokenizer = load_tokenizer(str(tiny_model_dir))
    for saver in (False, True):
        folder = checkpoint.save(tmp_path / str(saver), 3, trainers[saver], tokenizer, keep=1)
        torch.manual_seed(0)
        resumed = trainer_for(folder, not saver)
        assert checkpoint.load_state(folder, resumed.optimizer, resumed.scheduler, resumed.model) == 3
        group = resumed.optimizer.param_groups[0]
        assert group["fused"] is (True if not saver else None)  # this run's kernel, not the saving run's
        for param in resumed.params:
            state = resumed.optimizer.state[param]
            assert float(state["step"]) == 3 and state["exp_avg"].abs().max() > 0
        want = trainer_for(folder, saver)
        checkpoint.load_state(folder, want.optimizer, want.scheduler, want.model)
        got_metrics, want_metrics = resumed.train_step(batches[3]), want.train_step(batches[3])
        assert got_metrics["train/loss"] == pytest.approx(want_metrics["train/loss"], rel=1e-5)
        for a, b in zip(resumed.params, want.params, strict=True):
            np.testing.assert_allclose(
                a.detach().numpy(), b.detach().numpy(), rtol=0, atol=1e-5 * float(b.detach().abs().max())
            )
