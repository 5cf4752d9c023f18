"""mpirun -n 3: the trainer leader (rank 0) broadcasts changed weights over a gloo process group
(the NCCL code path on CPU) in many small buckets; both torch engines end up holding exactly the
trainer's tensors and version 2 after two syncs (one engine joins the group at its first receive);
then stop reaches both and leaves them alone."""

import sys

import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.loading import load_causal_lm
from agentrl.weights.nccl import DistributedWeightBroadcast


def main():
    world = MPI.COMM_WORLD
    model = load_causal_lm(sys.argv[1])
    is_trainer = world.Get_rank() == 0
    engine = None if is_trainer else TorchEngine(model, pad_token_id=0)
    # rank 2 joins the group at its first receive, as run_rollout does
    eager = engine if world.Get_rank() == 1 else None
    sync = DistributedWeightBroadcast(world, bucket_mb=0.01, backend="gloo", device="cpu", engine=eager)
    if is_trainer:
        for version, seed in ((1, 1), (2, 2)):
            torch.manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p))
            sync.send([(n, p.detach()) for n, p in model.named_parameters()], version)
        sync.stop()
    else:
        versions = [sync.receive(engine), sync.receive(engine)]
        assert versions == [1, 2] and engine.weight_version == 2, versions
        assert sync.receive(engine) is None and engine.weight_version == 2, "stop must leave the weights alone"
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    reference = transport.bcast_object(world, flat if is_trainer else None)
    assert (flat == reference).all(), f"rank {world.Get_rank()} holds different weights"
    print(f"rank {world.Get_rank()} holds version 2 weights", flush=True)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
