"""mpirun -n 2 nonfinite_ranks.py MODEL_DIR: two trainer ranks (replicas, then FSDP2 shards) skip an update alike
when only one of them sees a loss or gradient that is not finite, keep weights and optimizer state bit-identical,
and stop alike at trainer.max_skipped_nonfinite."""

import copy
import sys

import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.config import from_dict
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer.model import init_trainer_group
from agentrl.trainer.nonfinite import NonFiniteUpdates
from agentrl.weights.base import full_tensors
from tests.mpi.scripts.batches import synthetic_batch


def local(tensor):
    """This rank's own values (its shard under FSDP), copied."""
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.detach().clone()


def state(trainer) -> dict:
    """Everything a skipped update must leave as it was: the whole weights (a collective) and this rank's optimizer
    state and schedule."""
    optimizer = copy.deepcopy(trainer.optimizer.state_dict())
    for per_parameter in optimizer["state"].values():
        for key, value in per_parameter.items():
            if isinstance(value, torch.Tensor):
                per_parameter[key] = local(value)
    return {
        "weights": {name: tensor.clone() for name, tensor in full_tensors(trainer.named_weights())},
        "optimizer": optimizer,
        "scheduler": copy.deepcopy(trainer.scheduler.state_dict()),
    }


def same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{index}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def nan_loss_here(trainer) -> None:
    """From now on this rank's loss is NaN while its gradients stay finite (a NaN added as a constant)."""
    compute = trainer.algorithm.loss

    def loss(inputs):
        value, stats = compute(inputs)
        return value + torch.tensor(float("nan")), stats

    trainer.algorithm.loss = loss


def inf_gradient_here(trainer) -> None:
    """From now on this rank's own gradient of the last parameter (its shard under FSDP, already reduced) turns inf
    before the ranks' gradients are summed."""
    sync = trainer._sync_gradients

    def synced(params, vote=None, **riders):
        grad = params[-1].grad
        (grad.to_local() if hasattr(grad, "to_local") else grad).mul_(float("inf"))
        return sync(params, vote, **riders)

    trainer._sync_gradients = synced


def check(model_dir: str, world, group, fsdp: bool) -> None:
    rank = world.Get_rank()
    mode = "fsdp" if fsdp else "replicas"
    config = from_dict(
        {
            "model": {"path": model_dir},
            "layout": {"trainer": 2, "rollout": 1},
            "trainer": {"micro_batch_size": 5, "max_skipped_nonfinite": 2},
            "optimizer": {"lr": 1e-2},
            "lr_scheduler": {"warmup_steps": 4},
            "parallelism": {"fsdp": fsdp},
        }
    )
    torch.manual_seed(0)
    trainer = policy_trainer(config, model_dir, "cpu", group)
    vocab = trainer.model.config.vocab_size
    mine = range(0, 5) if rank == 0 else range(5, 8)
    assert trainer.train_step(synthetic_batch(0, mine, vocab))["train/skipped_nonfinite"] == 0.0
    before = state(trainer)

    compute = trainer.algorithm.loss
    if rank == 0:
        nan_loss_here(trainer)
    metrics = trainer.train_step(synthetic_batch(1, mine, vocab))
    trainer.algorithm.loss = compute
    assert metrics["train/skipped_nonfinite"] == 1.0, f"{mode} rank {rank}: {metrics}"
    same(before, state(trainer), f"{mode} rank {rank} after rank 0's NaN loss")

    if rank == 1:
        inf_gradient_here(trainer)
    try:
        trainer.train_step(synthetic_batch(2, mine, vocab))
        raise AssertionError(f"{mode} rank {rank}: the second update in a row did not stop the run")
    except NonFiniteUpdates as stop:
        assert "trainer.max_skipped_nonfinite=2" in str(stop), str(stop)
    same(before, state(trainer), f"{mode} rank {rank} after rank 1's inf gradient")
    flat = torch.cat([tensor.reshape(-1) for tensor in before["weights"].values()]).numpy()
    gathered = world.gather(flat, root=0)
    if rank == 0:
        assert (gathered[0] == gathered[1]).all(), f"{mode}: the ranks' weights differ"
        print(f"{mode}: both ranks skipped alike, kept their state and stopped alike", flush=True)
    transport.barrier(world)


def main():
    world = MPI.COMM_WORLD
    group = init_trainer_group(world, "cpu")
    for fsdp in (False, True):
        check(sys.argv[1], world, group, fsdp)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
