"""mpirun -n 4 with AGENTRL_RANKS_PER_NODE=2: shared-memory weights across 2 simulated nodes x 2 ranks.

Rank 0 (trainer leader) writes node 0's window; rank 2 leads node 1 and receives the one
broadcast per bucket into node 1's window; ranks 1 and 3 read their node's window. The
trainer sends two versions back to back with different values, in many small buckets
through two slots, while rank 3 copies its first bucket slowly: every rollout rank must hold
exactly version 1, then exactly version 2 (a reader that saw a slot being rewritten would
hold a mix). Then stop reaches every rank and leaves the weights alone.

Usage: weight_sync_shm.py MODEL_DIR [LAYOUT]   LAYOUT: "1,3,0" (default) or "1,2,1" (trainer,rollout,env)
"""

import os
import sys
import time

import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.config import LayoutConfig
from agentrl.layout import Layout, Role
from agentrl.rollout.torch_engine import TorchEngine
from agentrl.trainer.model import load_causal_lm
from agentrl.weights_shm import SharedMemoryWeights

BUCKET_MB = 0.02  # about 20 KiB: the tiny model goes through both slots many times


class SlowFirstBucket(TorchEngine):
    """A real torch engine that copies its first bucket of every update slowly (a reader lagging the writer)."""

    def begin_weight_update(self) -> None:
        super().begin_weight_update()
        self.buckets_loaded = 0

    def load_weight_bucket(self, named_tensors: list) -> None:
        if self.buckets_loaded == 0:
            time.sleep(0.5)
        super().load_weight_bucket(named_tensors)
        self.buckets_loaded += 1


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def main():
    os.environ.setdefault("AGENTRL_RANKS_PER_NODE", "2")
    trainer, rollout, env = (int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,3,0").split(","))
    layout = Layout(LayoutConfig(trainer=trainer, rollout=rollout, env=env), gpus_per_node=0)
    model = load_causal_lm(sys.argv[1])
    held = []
    if layout.role is Role.ENV:
        assert layout.weight_comm == MPI.COMM_NULL, "env ranks must stay out of the weight group"
    else:
        sync = SharedMemoryWeights(layout.weight_comm, layout.node, BUCKET_MB)
    if layout.is_trainer_leader:
        for version in (1, 2):
            torch.manual_seed(version)
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(torch.randn_like(p) * version)
            sync.send([(n, p.detach()) for n, p in model.named_parameters()], version)  # back to back
            held.append(flat(model))
        sync.stop()
        node, leads = layout.node, sync.leaders_comm.Get_size()
        print(f"trainer on node {node}: {leads} node leaders get the broadcast", flush=True)
    elif layout.role is Role.ROLLOUT:
        engine_class = SlowFirstBucket if layout.rank == layout.rollout_ranks[-1] else TorchEngine
        engine = engine_class(model, pad_token_id=0)
        for version in (1, 2):
            assert sync.receive(engine) == version and engine.weight_version == version
            held.append(flat(model))
        assert sync.receive(engine) is None and engine.weight_version == 2, "stop must leave the weights alone"
        part = "node leader (broadcast into the window)" if sync.is_node_leader else "window reader"
        print(f"rank {layout.rank} on node {layout.node} is a {part}", flush=True)
    expected = transport.bcast_object(layout.world, held if layout.is_trainer_leader else None, root=0)
    if layout.role is Role.ROLLOUT:
        for version, (mine, theirs) in enumerate(zip(held, expected, strict=True), start=1):
            same = torch.equal(mine, theirs)
            assert same, f"rank {layout.rank} holds different weights than the trainer's version {version}"
        print(f"rank {layout.rank} holds versions 1 and 2 bit for bit", flush=True)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
