"""mpirun -n 4 with AGENTRL_RANKS_PER_NODE=2: shared-memory weights across 2 simulated nodes x 2 ranks.

Rank 0 (trainer leader) writes node 0's window; rank 2 leads node 1 and receives the one
broadcast per bucket into node 1's window; ranks 1 and 3 read their node's window. The
trainer sends three versions back to back with different values, while both window
readers (ranks 1 and 3) lag. Copying (mapped off), each loads its first bucket of every
version slowly, in many small buckets through two slots; mapped (on), each keeps
generating from a version's slot for a while before it looks at its weights. Every rollout
rank must hold exactly each version when it looks (a slot rewritten too early would show
the next version's values, or a mix).
In place (inplace), the trainer's parameters live in node 0's window and it changes them
there, in lockstep: only once every rollout rank has looked at the last version.
Then stop reaches every rank and leaves the weights alone (mapped: copied out of the window).

Usage: weight_sync_shm.py MODEL_DIR [LAYOUT] [MAPPED]
  LAYOUT: "1,3,0" (default) or "1,2,1" (trainer,rollout,env); MAPPED: auto (default), on, off, inplace, or
  several of them separated by commas: each in turn in the one job, its lines starting "[MAPPED] ".
"""

import os
import sys
import time

import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.config import LayoutConfig
from agentrl.engine.torch_engine import TorchEngine
from agentrl.layout import Layout, Role
from agentrl.models.loading import load_causal_lm
from agentrl.weights.shm import SharedMemoryWeights

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


def in_window(model, sync) -> bool:
    """Whether every parameter views this rank's shared-memory window."""
    start = sync.window.slots[0].tensor.data_ptr()
    end = sync.window.slots[-1].tensor.data_ptr() + sync.window.capacity
    return all(start <= p.data_ptr() < end for p in model.parameters())


def main():
    os.environ.setdefault("AGENTRL_RANKS_PER_NODE", "2")
    trainer, rollout, env = (int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "1,3,0").split(","))
    layout = Layout(LayoutConfig(trainer=trainer, rollout=rollout, env=env), gpus_per_node=0)
    choices = (sys.argv[3] if len(sys.argv) > 3 else "auto").split(",")
    for choice in choices:
        prefix = f"[{choice}] " if len(choices) > 1 else ""
        sync_three_versions(layout, sys.argv[1], choice, prefix)


def sync_three_versions(layout: Layout, model_dir: str, choice: str, prefix: str) -> None:
    def say(line: str) -> None:
        print(prefix + line, flush=True)

    mapped = {"on": True, "off": False, "auto": "auto", "inplace": True}[choice]
    lockstep = choice == "inplace"
    model = load_causal_lm(model_dir)
    versions = (1, 2, 3)  # three: with two slots per node, version 3 rewrites version 1's slot
    held = []
    if layout.role is Role.ENV:
        assert layout.weight_comm == MPI.COMM_NULL, "env ranks must stay out of the weight group"
    else:
        sync = SharedMemoryWeights(layout.weight_comm, layout.node, BUCKET_MB, mapped, in_place=lockstep)
    if layout.is_trainer_leader:
        sync.place(model)
        for version in versions:
            if version > 1:
                sync.begin_update()
            torch.manual_seed(version)
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(torch.randn_like(p) * version)
            sync.send([(n, p.detach()) for n, p in model.named_parameters()], version)  # back to back
            held.append(flat(model))
            assert in_window(model, sync) == lockstep, "in place: the trainer's parameters must live in the window"
            if lockstep:
                layout.weight_comm.Barrier()  # every rollout rank is done with this version
        sync.stop()
        assert sync.window is None and torch.equal(flat(model), held[-1]), "stop: the trainer keeps its weights"
        node, leads = layout.node, sync.leaders_comm.Get_size()
        say(f"trainer on node {node}: {leads} node leaders get the broadcast; mapped: {sync.mapped}")
        say(f"trainer trains in the window: {sync.in_place}")
    elif layout.role is Role.ROLLOUT:
        lagging = layout.rank in (1, 3)  # the window readers of both nodes (ranks 0 and 2 fill the windows)
        engine = (SlowFirstBucket if lagging else TorchEngine)(model, pad_token_id=0)
        for version in versions:
            assert sync.receive(engine) == version and engine.weight_version == version
            if sync.mapped:
                assert in_window(model, sync), "mapped: every parameter must view the window"
                if lagging:
                    time.sleep(0.5)  # generating from this version's slot while the trainer publishes the next
            held.append(flat(model))
            if lockstep:
                layout.weight_comm.Barrier()
        assert sync.receive(engine) is None and engine.weight_version == versions[-1], "stop must leave the weights"
        assert torch.equal(flat(model), held[-1]), "stop changed the weights"
        assert not engine.weights_mapped, "stop must copy the weights out of the window it frees"
        part = "node leader (broadcast into the window)" if sync.is_node_leader else "window reader"
        how = "views the window" if sync.mapped else "copies from the window"
        say(
            f"rank {layout.rank} on node {layout.node} is a {part}; it {how}; the trainer waits for it: "
            f"{sync.paces_sender()}"
        )
    expected = transport.bcast_object(layout.world, held if layout.is_trainer_leader else None, root=0)
    if layout.role is Role.ROLLOUT:
        for version, mine, theirs in zip(versions, held, expected, strict=True):
            assert torch.equal(mine, theirs), f"rank {layout.rank} holds other weights than the trainer's {version}"
        say(f"rank {layout.rank} holds versions 1, 2 and 3 bit for bit")


if __name__ == "__main__":
    transport.abort_on_exception(main)()
