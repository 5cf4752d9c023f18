"""mpirun -n 2: PPO on two trainer ranks, each on an unequal shard of every batch, ends each step with the
policy AND critic weights one rank has after training on the whole batch (global advantage whitening and
statistics included); the critic is checkpointed in the step folder and resuming continues identically.

Usage: ppo_equivalence.py MODEL_DIR OUT_DIR [fsdp]
"""

import sys
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.config import from_dict
from agentrl.models.loading import load_tokenizer
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer import checkpoint
from agentrl.trainer.model import init_trainer_group
from agentrl.trajectory import Episode, concat, pack
from agentrl.weights.base import full_tensors

GROUPS = {0: range(0, 5), 1: range(5, 8)}  # unequal: under FSDP rank 1 pads with idle micro-steps
METRICS = ("train/loss", "train/value_loss", "train/explained_variance", "train/value_mean", "train/return_mean")


def multi_turn_batch(step: int, groups: range, vocab: int) -> dict:
    """8 groups x 4 episodes of 1-3 turns (1-4 generated tokens, an eos and an observation each), turn rewards
    and an end-of-episode bonus; only the groups in `groups`."""
    rng = np.random.default_rng(step)
    episodes = []
    for group in range(8):
        for _ in range(4):
            e = Episode(group=group, task_seed=0)
            e.extend(rng.integers(3, vocab, size=5), mask=0)
            for _ in range(int(rng.integers(1, 4))):
                start, n = len(e.tokens), int(rng.integers(1, 5))
                e.extend(rng.integers(3, vocab, size=n), mask=1, logprobs=-rng.random(n) * 3)
                e.turn_spans.append((start, len(e.tokens)))
                e.turn_rewards.append(float(rng.random() < 0.3) * 0.5)
                e.turn_states.append(0)
                e.extend(rng.integers(3, vocab, size=3), mask=0)
            e.reward = sum(e.turn_rewards) + float(rng.random() < 0.5)
            episodes.append(e)
    return pack([e for e in episodes if e.group in groups])


def whole_batch(step: int, vocab: int) -> dict:
    return concat([multi_turn_batch(step, GROUPS[0], vocab), multi_turn_batch(step, GROUPS[1], vocab)])


def weights(trainer) -> dict[str, torch.Tensor]:
    """Collective under FSDP: the full policy and critic weights on every rank."""
    named = [(f"policy.{n}", p.detach()) for n, p in trainer.model.named_parameters()]
    named += [(f"critic.{n}", p.detach()) for n, p in trainer.extras[0].module.named_parameters()]
    return {name: tensor.clone() for name, tensor in full_tensors(named)}


def assert_same(expected: dict, actual: dict, what: str, atol=2e-5, rtol=1e-4) -> None:
    assert list(expected) == list(actual), f"{what}: names differ"
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=atol, rtol=rtol, msg=f"{what}: {name}")


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    fsdp = "fsdp" in sys.argv[3:]
    common = {
        "model": {"path": model_dir},
        "steps": 4,
        "layout": {"trainer": 2, "rollout": 1},
        "trainer": {"micro_batch_size": 5},
        "optimizer": {"lr": 1e-2},
        "algorithm": {"name": "ppo", "lam": 0.9, "critic_lr": 1e-2, "value_clip": 0.2},
    }
    config = from_dict({**common, "parallelism": {"fsdp": fsdp}})
    alone_config = from_dict({**common, "parallelism": {"fsdp": False}})
    torch.manual_seed(0)
    group = init_trainer_group(world, "cpu")
    trainer = policy_trainer(config, model_dir, "cpu", group)
    vocab = trainer.model.config.vocab_size
    if fsdp:
        first = next(trainer.extras[0].module.parameters())
        assert type(first).__name__ == "DTensor" and first.to_local().shape[0] < first.shape[0], "critic not sharded"
    start = weights(trainer)
    metrics = [trainer.train_step(multi_turn_batch(step, GROUPS[rank], vocab)) for step in range(3)]
    trained = weights(trainer)
    gathered = world.gather({n: t.numpy() for n, t in trained.items()}, root=0)
    if rank == 0:
        for name in trained:
            assert np.array_equal(gathered[0][name], gathered[1][name]), f"{name}: ranks diverged"
        moved = [n for n in start if n.startswith("critic.") and not torch.equal(start[n], trained[n])]
        assert len(moved) > 10, f"the critic barely trained: {moved}"
        alone = policy_trainer(alone_config, model_dir, "cpu", None)
        alone_metrics = [alone.train_step(whole_batch(step, vocab)) for step in range(3)]
        for key in METRICS:
            mine, whole = [m[key] for m in metrics], [m[key] for m in alone_metrics]
            np.testing.assert_allclose(mine, whole, rtol=1e-4, atol=1e-6, err_msg=key)
        assert alone_metrics[-1]["train/explained_variance"] != 0.0
        # FSDP's reduce-scatter sums in another order, and AdamW's g / sqrt(v) magnifies the rounding where a gradient
        # is near zero: 2.4e-5 on one critic weight after three steps on an AVX-512 machine
        assert_same(weights(alone), trained, "2 ranks vs whole batch", atol=5e-5 if fsdp else 2e-5)
        print(f"ppo{' fsdp' if fsdp else ''}: 2 ranks == 1 rank on the whole batch (policy and critic)", flush=True)

    tokenizer = load_tokenizer(model_dir)
    run_dir = out_dir / "run"
    saved = checkpoint.save(
        run_dir,
        3,
        trainer,
        tokenizer,
        keep=2,
        leader=rank == 0,
        extra_state=trainer.extra_state,
    )
    transport.barrier(world)
    if rank == 0:
        assert saved is not None and (saved / "critic" / "model.safetensors").is_file()
    path = checkpoint.step_path(run_dir, 3)
    resumed = policy_trainer(config, str(path), "cpu", group)  # as `agentrl train resume=true` builds it
    step = checkpoint.load_state(
        path, resumed.optimizer, resumed.scheduler, resumed.model, extra_state=resumed.extra_state
    )
    assert step == 3
    assert_same(trained, weights(resumed), "loaded policy and critic", 0, 0)
    for step_trainer in (trainer, resumed):
        step_trainer.train_step(multi_turn_batch(3, GROUPS[rank], vocab))
    continued, restarted = weights(trainer), weights(resumed)
    if rank == 0:
        assert_same(continued, restarted, "resumed vs uninterrupted", 1e-6, 1e-5)
        print(f"ppo{' fsdp' if fsdp else ''}: the critic checkpoint resumes identically", flush=True)
    transport.barrier(world)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
