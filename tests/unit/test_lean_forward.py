"""The trainer's lean forward (agentrl/trainer/lean_forward.py) trains as the model's own forward does, and stands
aside where it cannot."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from agentrl.config import from_dict
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer.lean_forward import LeanForward
from tests.unit.test_lean_decoder import FAMILIES, build
from tests.unit.test_shared_prefix import ROLLOUT, assert_close_gradients, make_batch


def trainer(model_dir, lean: bool, algorithm=None, lora=None, parallelism=None):
    config = from_dict(
        {
            "model": {"path": str(model_dir), "lora": lora},
            "algorithm": {"name": "grpo", **(algorithm or {})},
            "rollout": ROLLOUT,
            "trainer": {"micro_batch_size": 12},
            "optimizer": {"lr": 1e-3},
            "parallelism": parallelism or {},
        }
    )
    built = policy_trainer(config, str(model_dir), "cpu")
    if not lean:
        built.lean_forwards = {}
    return built


@pytest.mark.parametrize(
    ("algorithm", "lora"),
    [({}, None), ({"kl_coef": 0.1}, None), ({}, {"rank": 4, "alpha": 8})],
    ids=["plain", "with a reference", "lora"],
)
def test_whole_rows_train_as_by_the_models_own_forward(tiny_model_dir, algorithm, lora):
    batch = make_batch(3, 4)
    trainers, metrics = {}, {}
    for lean in (True, False):
        torch.manual_seed(0)
        trainers[lean] = trainer(tiny_model_dir, lean, algorithm, lora)
        if lean:
            assert trainers[lean].lean_forwards and all(trainers[lean].lean_forwards.values())
        if algorithm.get("kl_coef"):  # the policy off the reference, so the KL term has a gradient
            with torch.no_grad():
                for param in trainers[lean].params:
                    param.add_(0.05 * torch.randn_like(param))
        metrics[lean] = trainers[lean].train_step(batch)
    assert metrics[False]["train/grad_norm"] > 1e-3
    assert_close_gradients(trainers[True].model, trainers[False].model)
    for key, want in metrics[False].items():
        assert metrics[True][key] == pytest.approx(want, rel=1e-5, abs=1e-7), key


def test_activation_checkpointing_keeps_the_models_forward(tiny_model_dir):
    built = trainer(tiny_model_dir, True, parallelism={"activation_checkpointing": True})
    assert built.lean_forwards == {}


def test_a_model_outside_the_checked_families_or_unlike_its_forward_gets_none(tiny_model_dir):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32))
    assert LeanForward.for_model(gpt2) is None
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert LeanForward.for_model(model) is not None
    model.config.attention_dropout = 0.1  # dropout the lean attention does not apply
    assert LeanForward.for_model(model) is None
    model.config.attention_dropout = 0.0
    original = model.model.norm.forward
    model.model.norm.forward = lambda x: original(x) * 2.0  # a final norm unlike the fused one the lean forward runs
    assert LeanForward.for_model(model) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_kept_positions_get_the_whole_forwards_logits_and_gradients_in_every_layout(family):
    """`keep` runs the last layer's queries, MLP and the LM head on the kept positions only; their logits and the
    gradients through them are the whole forward's, for whole rows, packed sequences and the split layout."""
    model = build(family).train()
    lean = LeanForward.for_model(model)
    assert lean is not None
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 90, (3, 7), generator=generator)
    steps = torch.arange(7)
    causal = (steps[None, :] <= steps[:, None]).expand(3, 1, 7, 7)
    layouts = {  # name -> (forward(keep), positions it computes)
        "rows": (lambda keep: lean.rows(ids, keep), 21),
        "packed": (lambda keep: lean.packed(ids, steps.expand(3, 7), causal, keep), 21),
        "split": (  # two prefixes of 3 tokens, three rows' rests of 4, the last row's prefix cut at 2
            lambda keep: lean.split(
                ids[:2, :3],
                ids[:, 3:],
                steps[3:].expand(3, 4),
                torch.tensor([0, 1, 1]),
                torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=torch.bool),
                keep,
            ),
            6 + 12,
        ),
    }
    for (name, (forward, positions)), only_late in itertools.product(layouts.items(), (False, True)):
        # some positions at random, the first and the last; or only late ones (no prefix position of the split one)
        picked = {positions - 1, *torch.randperm(positions, generator=generator)[:4].tolist()}
        keep = torch.tensor(sorted(p for p in picked | {0, 2} if not only_late or p >= 6))
        weights = torch.randn(len(keep), model.config.vocab_size, generator=generator)
        grads = []
        for kept in (None, keep):
            model.zero_grad()
            logits = forward(kept)
            logits = logits[keep] if kept is None else logits
            (logits * weights).sum().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            if kept is None:
                whole = logits.detach()
            else:
                assert_near(logits.detach(), whole, name, rtol=1e-5, atol=1e-5)
        assert grads[0].keys() == grads[1].keys()
        for parameter, grad in grads[0].items():  # float32 rounding: 1e-5 of the largest, as test_shared_prefix
            scale = float(grad.abs().max())
            assert_near(grads[1][parameter], grad, f"{name}, {parameter}", rtol=1e-4, atol=1e-5 * scale)


def assert_near(got: torch.Tensor, expected: torch.Tensor, where: str, rtol: float, atol: float) -> None:
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=lambda message: f"{where}: {message}")
