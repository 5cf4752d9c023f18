"""mpirun -n 2: two FSDP2 trainer ranks on unequal shards of each batch end with the weights of one
rank trained on the whole batch; the checkpoint is an HF folder; resuming from it continues identically.

Usage: fsdp_equivalence.py MODEL_DIR OUT_DIR [activation_checkpointing] [kl] [bf16]
"""

import sys
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.config import from_dict
from agentrl.models.loading import load_causal_lm, load_tokenizer
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer import checkpoint
from agentrl.trainer.model import init_trainer_group
from agentrl.trajectory import concat
from agentrl.weights.base import full_tensors
from tests.mpi.scripts.batches import synthetic_batch

GROUPS = {0: range(0, 5), 1: range(5, 8)}  # unequal: rank 1 runs fewer micro-batches and must pad with idle ones


def whole_batch(step: int, vocab: int) -> dict:
    return concat([synthetic_batch(step, GROUPS[0], vocab), synthetic_batch(step, GROUPS[1], vocab)])


def gathered(trainer) -> dict[str, torch.Tensor]:
    """Collective: the full weights on every rank."""
    return {name: tensor.clone() for name, tensor in full_tensors(trainer.named_weights())}


def assert_same(expected: dict, actual: dict, what: str, atol=2e-5, rtol=1e-4) -> None:
    assert list(expected) == list(actual), f"{what}: names differ"
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=atol, rtol=rtol, msg=f"{what}: {name}")


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    flags = set(sys.argv[3:])
    common = {
        "model": {"path": model_dir},
        "steps": 4,
        "layout": {"trainer": 2, "rollout": 1},
        "trainer": {"micro_batch_size": 5},
        "optimizer": {"lr": 1e-2},
        "algorithm": {"kl_coef": 0.05 if "kl" in flags else 0.0},
    }
    parallelism = {
        "activation_checkpointing": "activation_checkpointing" in flags,
        "mixed_precision": "bf16" if "bf16" in flags else "none",
    }
    sharded_cfg = from_dict({**common, "parallelism": {**parallelism, "fsdp": True}})
    alone_cfg = from_dict({**common, "parallelism": {**parallelism, "fsdp": False}})
    torch.manual_seed(0)
    group = init_trainer_group(world, "cpu")
    trainer = policy_trainer(sharded_cfg, model_dir, "cpu", group)
    vocab = trainer.model.config.vocab_size
    first = trainer.named_weights()[0][1]
    assert type(first).__name__ == "DTensor" and first.to_local().shape[0] < first.shape[0], "weights not sharded"
    checkpointed = [layer.gradient_checkpointing for layer in trainer.model.model.layers]
    assert checkpointed == [trainer.parallelism.activation_checkpointing] * len(checkpointed), checkpointed
    if "bf16" in flags:
        seen = []
        layer = trainer.model.model.layers[0].mlp.up_proj
        layer.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    norms = [trainer.train_step(synthetic_batch(step, GROUPS[rank], vocab))["train/grad_norm"] for step in range(3)]
    sharded = gathered(trainer)
    alone = policy_trainer(alone_cfg, model_dir, "cpu", None) if rank == 0 else None
    if rank == 0:
        alone_norms = [alone.train_step(whole_batch(step, vocab))["train/grad_norm"] for step in range(3)]
        start = {n: p.detach() for n, p in load_causal_lm(model_dir).named_parameters()}
        if "bf16" in flags:
            assert seen and all(dtype == torch.bfloat16 for dtype in seen), f"forward ran in {set(seen)}"
            assert all(t.dtype == torch.float32 for t in sharded.values()), "master weights must stay float32"
            moved = max(float((sharded[n] - start[n]).abs().max()) for n in start)
            assert moved > 1e-3, "bf16 training did not change the weights"
            # bf16 compute vs float32 compute: close, not equal.
            assert_same({n: p.detach() for n, p in alone.model.named_parameters()}, sharded, "bf16", 0.05, 0.05)
        else:
            np.testing.assert_allclose(norms, alone_norms, rtol=1e-4, err_msg="grad norm is not the global norm")
            assert_same({n: p.detach() for n, p in alone.model.named_parameters()}, sharded, "fsdp vs whole batch")
        print("fsdp: 2 sharded ranks == 1 rank on the whole batch", flush=True)

    tokenizer = load_tokenizer(model_dir)
    run_dir = out_dir / "run"
    saved = checkpoint.save(run_dir, 3, trainer, tokenizer, keep=2, leader=rank == 0)
    transport.barrier(world)
    if rank == 0:
        assert saved is not None and (saved / "model.safetensors").is_file()
        loaded = {n: p.detach() for n, p in load_causal_lm(str(saved)).named_parameters()}
        assert_same(sharded, loaded, "checkpoint", 0, 0)
    resumed_path = checkpoint.step_path(run_dir, 3)
    resumed = policy_trainer(sharded_cfg, str(resumed_path), "cpu", group)
    assert checkpoint.load_state(resumed_path, resumed.optimizer, resumed.scheduler, resumed.model) == 3
    for step_trainer in (trainer, resumed):
        step_trainer.train_step(synthetic_batch(3, GROUPS[rank], vocab))
    continued, restarted = gathered(trainer), gathered(resumed)
    if rank == 0:
        assert_same(continued, restarted, "resumed vs uninterrupted", 1e-6, 1e-5)
        print("fsdp: checkpoint loads with from_pretrained and resume continues identically", flush=True)
    transport.barrier(world)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
