"""mpirun across the test bed's nodes: each weight sync's bytes into every node, and the weights bit for bit.

Usage: weights_across_nodes.py MODEL_DIR TRANSPORT [SYNCS]   (TRANSPORT: shm or mpi; layout 1 trainer, the rest rollout)

The trainer leader (rank 0, node0) sends SYNCS versions; around each one every rank meets in a
barrier and rank 0 reads the host side of every node's veth (/sys/class/net/arnK, visible in
every node: sysfs was mounted in the host's network namespace): its tx_bytes are the bytes that
went into node K over the bridge. Prints one JSON line: the model's bytes, and per sync the
bytes into each node. Every rollout rank then checks it holds the trainer's last version exactly.
"""

import json
import sys
from pathlib import Path

import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.config import LayoutConfig
from agentrl.engine.torch_engine import TorchEngine
from agentrl.layout import Layout
from agentrl.models.loading import load_causal_lm
from agentrl.weights.mpi import MPIWeightBroadcast
from agentrl.weights.shm import SharedMemoryWeights

BUCKET_MB = 4.0


def into_nodes(count: int) -> list[int]:
    return [int(Path(f"/sys/class/net/arn{k}/statistics/tx_bytes").read_text()) for k in range(count)]


def main():
    model_dir, how = sys.argv[1], sys.argv[2]
    syncs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    world = MPI.COMM_WORLD
    layout = Layout(LayoutConfig(trainer=1, rollout=world.Get_size() - 1, env=0), gpus_per_node=0)
    nodes = len(set(layout.nodes))
    model = load_causal_lm(model_dir)
    if how == "shm":
        sync = SharedMemoryWeights(layout.weight_comm, layout.node, BUCKET_MB, mapped=False)
    else:
        sync = MPIWeightBroadcast(layout.weight_comm, BUCKET_MB)
    engine = None if layout.is_trainer_leader else TorchEngine(model, pad_token_id=0)
    per_sync = []
    for version in range(1, syncs + 1):
        if layout.is_trainer_leader:
            torch.manual_seed(version)
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(torch.randn_like(p))
        world.Barrier()
        before = into_nodes(nodes) if layout.rank == 0 else None
        if layout.is_trainer_leader:
            sync.send([(n, p.detach()) for n, p in model.named_parameters()], version)
        else:
            assert sync.receive(engine) == version
        world.Barrier()
        if layout.rank == 0:
            per_sync.append([after - b for after, b in zip(into_nodes(nodes), before, strict=True)])
    if layout.is_trainer_leader:
        sync.stop()
    else:
        assert sync.receive(engine) is None
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    reference = transport.bcast_object(world, flat if layout.rank == 0 else None)
    same = world.allgather(bool((flat == reference).all()))
    if layout.rank == 0:
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        report = {"transport": how, "hosts": layout.hosts, "model_bytes": model_bytes, "into_node_per_sync": per_sync}
        print(json.dumps({**report, "bit_for_bit": same}), flush=True)
        assert all(same), f"ranks holding other weights than the trainer's: {[r for r, s in enumerate(same) if not s]}"


if __name__ == "__main__":
    transport.abort_on_exception(main)()
