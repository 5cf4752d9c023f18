"""mpirun -n 3 on one GPU: the trainer leader shares its parameters over CUDA IPC with two readers on its GPU.

Versions 1-3 send the parameters themselves (handles travel once, at version 1); version 4
sends tensors on the CPU, which go through the writer's staging buffer (a new generation of
handles). After each version every reader holds the writer's tensors bit for bit; then stop
reaches both. argv: MODEL_DIR.
"""

import sys

import numpy as np
import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.loading import load_causal_lm
from agentrl.weights.cuda_ipc import CUDAIPCWeightSync


def weights_of(model) -> np.ndarray:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]).cpu().numpy()


def main():
    world = MPI.COMM_WORLD
    model = load_causal_lm(sys.argv[1], device="cuda:0")
    sync = CUDAIPCWeightSync(world, device="cuda:0")
    versions = (1, 2, 3, 4)
    if world.Get_rank() == 0:
        torch.manual_seed(1)
        for version in versions:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p))  # the optimizer writes in place: the shared memory stays put
            named = [(n, p.detach()) for n, p in model.named_parameters()]
            if version == 4:
                named = [(n, t.cpu()) for n, t in named]
            sync.send(named, version)
            transport.bcast_object(world, weights_of(model))
        print(f"writer used {sync.generation} generations of handles", flush=True)
        sync.stop()
    else:
        engine = TorchEngine(model, pad_token_id=0)
        for version in versions:
            assert sync.receive(engine) == version and engine.weight_version == version
            expected = transport.bcast_object(world, None)
            assert (weights_of(model) == expected).all(), f"rank {world.Get_rank()} differs at version {version}"
        assert sync.generation == 2, sync.generation
        assert sync.receive(engine) is None
        print(f"rank {world.Get_rank()} holds every version bit for bit", flush=True)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
