"""mpirun -n 3: ranks 0-1 hold a model sharded with FSDP2, rank 2 is a rollout engine.

The leader gathers and broadcasts bucket by bucket (rank 1 joins each gather with GatherOnly);
the rollout rank ends with exactly the full weights. The leader samples its resident memory
during the sync and during a gather of the whole model, and prints both peaks:
the bucketed sync (after a warm-up sync) must stay far below one full copy.

Usage: fsdp_weight_sync.py WORK_DIR [BUCKET_MB] [TRANSPORT]   TRANSPORT: mpi (default), shm or shm-mapped
(the engine views the window: it holds two whole versions, so the bucket bound is not checked)
"""

import ctypes
import sys
import threading
import time

import torch
from mpi4py import MPI

from agentrl import transport
from agentrl.engine.torch_engine import TorchEngine
from agentrl.trainer import parallel
from agentrl.trainer.model import init_trainer_group
from agentrl.weights.base import GatherOnly, full_tensors
from agentrl.weights.mpi import MPIWeightBroadcast
from agentrl.weights.shm import SharedMemoryWeights

PAGE = 4096


def build_model(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config)


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class PeakMemory:
    """Highest resident memory above the level at entry, sampled every 0.2 ms by a thread."""

    def __enter__(self):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so earlier peaks are not reused unseen
        self.base = self.peak = resident_bytes()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, resident_bytes())
            time.sleep(0.0002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, resident_bytes())
        self.extra = self.peak - self.base


def return_freed_memory_at_once() -> None:
    """Resident memory then counts live buffers only: glibc otherwise raises its mmap threshold after a large free
    and keeps later freed 1 MiB buffers in its heap (8.3 MiB held in one CI run, 2.3-4.8 MiB usually, 2.5 with this)."""
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc = ctypes.CDLL(None)
    libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)


def main():
    return_freed_memory_at_once()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    bucket_mb = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    transport_name = sys.argv[3] if len(sys.argv) > 3 else "mpi"

    def weight_sync(comm):
        if transport_name.startswith("shm"):
            return SharedMemoryWeights(comm, node=0, bucket_mb=bucket_mb, mapped=transport_name == "shm-mapped")
        return MPIWeightBroadcast(comm, bucket_mb)

    is_trainer = rank < 2
    role_comm = world.Split(color=0 if is_trainer else 1, key=rank)
    weight_comm = world.Split(color=0 if rank != 1 else MPI.UNDEFINED, key=rank)
    mib = 2**20
    if is_trainer:
        group = init_trainer_group(role_comm, "cpu")
        model = parallel.shard(build_model(seed=0), group, "cpu")
        named = [(name, p.detach()) for name, p in model.named_parameters()]
        model_bytes = sum(t.numel() * t.element_size() for _, t in named)
        largest = max(t.numel() * t.element_size() for _, t in named)
        sync = weight_sync(weight_comm) if rank == 0 else GatherOnly()
        sync.send(named, version=1)  # warm-up: first-call allocations (gloo, DTensor dispatch) are not the sync's
        with PeakMemory() as bucketed:
            sync.send(named, version=2)
        with PeakMemory() as whole:
            full = dict(full_tensors(named))  # what a sync without buckets would hold at once
        if rank == 0:
            print(f"resident before the sync {bucketed.base / mib:.1f} MiB", flush=True)
            print(
                f"model {model_bytes / mib:.1f} MiB, largest tensor {largest / mib:.2f} MiB, bucket {bucket_mb} MiB: "
                f"extra memory during the bucketed sync {bucketed.extra / mib:.1f} MiB, "
                f"gathering the whole model {whole.extra / mib:.1f} MiB",
                flush=True,
            )
            # Staging buffer (shm: the window's two slots), MPI's copy of it in flight, one gathered tensor, and slack.
            bound = 3 * bucket_mb * mib + largest + 4 * mib
            if transport_name != "shm-mapped":
                assert bucketed.extra < bound, f"the sync held {bucketed.extra / mib:.1f} MiB, over {bound / mib:.1f}"
                assert bucketed.extra < whole.extra / 3, "the bucketed sync held about as much as the whole model"
            transport.bcast_object(weight_comm, {name: t.numpy() for name, t in full.items()})
    else:
        engine = TorchEngine(build_model(seed=1), pad_token_id=0)
        receiver = weight_sync(weight_comm)
        assert [receiver.receive(engine), receiver.receive(engine)] == [1, 2]
        assert engine.weights_mapped == (transport_name == "shm-mapped")
        expected = transport.bcast_object(weight_comm, None)
        for name, param in engine.model.named_parameters():
            assert torch.equal(param.detach(), torch.from_numpy(expected[name])), f"{name} differs from the trainer's"
        print("rollout rank holds the gathered weights", flush=True)
    transport.barrier(world)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
