"""mpirun -n 3: adapter-only syncs from a PEFT model (rank 0) into two torch engines (ranks 1, 2), confirmed.

Version 1 arrives intact: both engines hold PEFT's merge of the adapters. Version 2 is damaged on its way into
rank 2's engine (one adapter value changed as it loads): every rank raises StaleWeights naming rank 2.

Usage: lora_sync.py MODEL_DIR TRANSPORT   (TRANSPORT: mpi or shm)
"""

import copy
import sys

import torch
from mpi4py import MPI

from agentrl.config.schema import LoraConfig
from agentrl.engine.torch_engine import TorchEngine
from agentrl.models.loading import load_causal_lm
from agentrl.trainer.lora import adapter_weights, apply_lora
from agentrl.weights.lora import ConfirmedAdapterSync, StaleWeights
from agentrl.weights.mpi import MPIWeightBroadcast
from agentrl.weights.shm import SharedMemoryWeights


class DamagingEngine(TorchEngine):
    """A real torch engine whose copy of version `damaged` comes out changed (a sync that did not arrive intact)."""

    damaged: int | None = None
    version_loading = 0

    def load_weight_bucket(self, named_tensors: list) -> None:
        if self.version_loading == self.damaged:
            named_tensors = [(n, t + 1e-3 if i == 0 else t) for i, (n, t) in enumerate(named_tensors)]
        super().load_weight_bucket(named_tensors)


def main() -> None:
    model_dir, kind = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    inner = (
        MPIWeightBroadcast(comm, 0.01)
        if kind == "mpi"
        else SharedMemoryWeights(comm, node=0, bucket_mb=0.01, mapped=False, in_place=False)
    )
    sync = ConfirmedAdapterSync(inner, comm)
    lora = LoraConfig(rank=4, alpha=8)
    if rank == 0:
        model = apply_lora(load_causal_lm(model_dir), lora, model_dir)
        torch.manual_seed(0)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.05)
    else:
        engine = DamagingEngine(load_causal_lm(model_dir), pad_token_id=0)
        engine.use_lora(lora.scaling)
        engine.damaged = 2 if rank == 2 else None
    for version in (1, 2):
        try:
            if rank == 0:
                if version == 2:
                    with torch.no_grad():
                        for name, param in model.named_parameters():
                            if "lora_A" in name:
                                param.mul_(1.5)
                sync.send(adapter_weights(model), version)
                expected = copy.deepcopy(model).merge_and_unload()
                comm.bcast({n: p.detach() for n, p in expected.named_parameters()}, root=0)
            else:
                engine.version_loading = version
                sync.receive(engine)
                expected = comm.bcast(None, root=0)
                ours = dict(engine.model.named_parameters())
                for name, tensor in expected.items():
                    torch.testing.assert_close(ours[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
                print(f"rank {rank}: version {version} holds PEFT's merge", flush=True)
        except StaleWeights as error:
            print(f"rank {rank}: StaleWeights at version {version}: {error}", flush=True)
            break
    comm.Barrier()


if __name__ == "__main__":
    main()
