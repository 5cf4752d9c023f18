"""mpirun -n 2 replicas.py MODEL_DIR [ALGORITHM ...]: two trainer ranks, each on half the groups, end every
step with identical weights, and match one rank trained on the whole batch, for each algorithm named; their sums
over MPI (a CPU training run's), and for the first algorithm also over torch.distributed (FSDP's, a GPU's) and
with bfloat16 parameters (summed in float32)."""

import sys

import numpy as np
import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.config import from_dict
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer.model import init_trainer_group
from agentrl.trajectory import concat, trained_totals
from tests.mpi.scripts.batches import synthetic_batch


def check(algorithm: str, model_dir: str, world, group, over_mpi: bool, dtype: str = "float32") -> None:
    rank = world.Get_rank()
    config = from_dict(
        {
            "model": {"path": model_dir, "dtype": dtype},
            "steps": 3,
            "trainer": {"micro_batch_size": 5},
            "optimizer": {"lr": 1e-2, "max_grad_norm": 0.01},  # small: grpo's steps clip
            "algorithm": {"name": algorithm},
        }
    )
    torch.manual_seed(0)
    trainer = policy_trainer(config, model_dir, "cpu", group, world if over_mpi else None)
    assert (trainer.sum_comm is not None) == over_mpi
    vocab = trainer.model.config.vocab_size
    half = range(0, 4) if rank == 0 else range(4, 8)
    gathers = count_gathers()
    norms = []
    for step in range(3):
        # numbers a training loop sums ride the step's statistics, names one rank lacks counting 0 there (step 0);
        # once every rank has the names of the last gather (step 2), they ride the gradient sum, with no gather
        more = {"both": 1.0, **({f"only_rank{rank}": rank + 1.0} if step == 0 else {})} if over_mpi else {}
        expected = {"both": 2.0, **({"only_rank0": 1.0, "only_rank1": 2.0} if step == 0 else {})}
        # and the loss's denominators as the shards' senders give them (both halves' trained totals), or counted
        given = sum(trained_totals(synthetic_batch(step, part, vocab)) for part in (range(0, 4), range(4, 8)))
        metrics, totals = trainer.train_and_sum(synthetic_batch(step, half, vocab), more, given if step % 2 else None)
        assert not over_mpi or totals == expected, totals
        norms.append(metrics["train/grad_norm"])
        every = world.allgather(metrics)
        assert every[0] == every[1], f"{algorithm} step {step}: the ranks' metrics differ"
        flat = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()]).float().numpy()
        gathered = world.gather(flat, root=0)
        if rank == 0:
            assert np.array_equal(gathered[0], gathered[1]), f"{algorithm} step {step}: trainer replicas diverged"
    # float32 over MPI: steps 0 and 1 gather (new names), step 2 rides; bfloat16 gradients: every step gathers
    assert not over_mpi or gathers() == (2 if dtype == "float32" else 3), gathers()
    if dtype != "float32":  # replicas alike is the check here: whole-batch training rounds otherwise in bfloat16
        if rank == 0:
            print(f"{algorithm}: {dtype} replicas identical (sums over MPI)", flush=True)
        transport.barrier(world)
        return
    if rank == 0:
        torch.manual_seed(0)
        alone = policy_trainer(config, model_dir, "cpu", None)
        for step in range(3):
            halves = [synthetic_batch(step, range(0, 4), vocab), synthetic_batch(step, range(4, 8), vocab)]
            norm = alone.train_step(concat(halves))["train/grad_norm"]
            # the summed gradients are clipped as one flat tensor, one rank's tensor by tensor: the same norm
            assert abs(norm - norms[step]) <= 1e-4 * norm, (step, norm, norms[step])
        for (name, a), (_, b) in zip(alone.model.named_parameters(), trainer.model.named_parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=f"{algorithm} {name}: 2 ranks != 1 rank")
        route = "MPI" if over_mpi else "torch.distributed"
        print(f"{algorithm}: replicas identical and equal to whole-batch training (sums over {route})", flush=True)
    transport.barrier(world)


def count_gathers():
    """From now on, count the trainer's gathers of named sums (`transport.allreduce_named`); returns the count."""
    calls = []
    original = getattr(transport.allreduce_named, "original", transport.allreduce_named)

    def counted(*args):
        calls.append(1)
        return original(*args)

    counted.original = original
    transport.allreduce_named = counted
    return lambda: len(calls)


def main():
    world = MPI.COMM_WORLD
    group = init_trainer_group(world, "cpu")
    algorithms = sys.argv[2:] or ["grpo"]
    for algorithm in algorithms:
        check(algorithm, sys.argv[1], world, group, over_mpi=True)
    check(algorithms[0], sys.argv[1], world, group, over_mpi=False)
    check(algorithms[0], sys.argv[1], world, group, over_mpi=True, dtype="bfloat16")


if __name__ == "__main__":
    transport.abort_on_exception(main)()
