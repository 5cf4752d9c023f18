"""mpirun -n 3: rank 0 (trainer leader) broadcasts changed weights in many small buckets;
both rollout engines end up with the same tensors and the new version; then stop reaches both."""

import sys

import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.loading import load_causal_lm
from agentrl.weights.mpi import MPIWeightBroadcast


def main():
    world = MPI.COMM_WORLD
    model = load_causal_lm(sys.argv[1])
    sync = MPIWeightBroadcast(world, bucket_mb=0.01)  # forces many buckets
    if world.Get_rank() == 0:
        torch.manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        for version in (1, 2):
            sync.send([(n, p.detach()) for n, p in model.named_parameters()], version)
        sync.stop()
        expected = torch.cat([p.reshape(-1) for p in model.parameters()])
    else:
        engine = TorchEngine(model, pad_token_id=0)
        versions = [sync.receive(engine), sync.receive(engine)]
        assert versions == [1, 2] and engine.weight_version == 2, versions
        assert sync.receive(engine) is None and engine.weight_version == 2, "stop must leave the weights alone"
        expected = None
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    reference = transport.bcast_object(world, expected.detach().numpy() if expected is not None else None)
    assert (flat == reference).all(), f"rank {world.Get_rank()} holds different weights"
    print(f"rank {world.Get_rank()} holds version 2 weights", flush=True)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
