"""mpirun -n 2: rank 1 comes LATE_S late to the layout's start and to the first shared-memory weight sync.

Rank 0 gets there first both times and must wait without spinning (MPI's blocking collectives spin: on a node
of more ranks than cores, a rank still importing torch would lose a core to it). Rank 0 prints the share of a
core it used while waiting.

Usage: late_rank.py MODEL_DIR
"""

import sys
import time

from mpi4py import MPI

from agentrl import transport
from agentrl.config import LayoutConfig
from agentrl.engine.torch_engine import TorchEngine
from agentrl.layout import Layout
from agentrl.models.loading import load_causal_lm
from agentrl.weights.shm import SharedMemoryWeights

LATE_S = 2.0


def core_share(work) -> tuple[float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return (time.process_time() - cpu) / (time.perf_counter() - wall), result


def main():
    rank = MPI.COMM_WORLD.Get_rank()
    model = load_causal_lm(sys.argv[1])
    if rank == 1:
        time.sleep(LATE_S)
    share, layout = core_share(lambda: Layout(LayoutConfig(trainer=1, rollout=1, env=0), gpus_per_node=0))
    if rank == 0:
        print(f"layout: rank 0 used {share:.2f} of a core", flush=True)
    sync = SharedMemoryWeights(layout.weight_comm, layout.node, bucket_mb=1.0)
    if rank == 0:
        share, _ = core_share(lambda: sync.send([(n, p.detach()) for n, p in model.named_parameters()], 1))
        print(f"first weight sync: rank 0 used {share:.2f} of a core", flush=True)
        sync.stop()
    else:
        time.sleep(LATE_S)
        engine = TorchEngine(model, pad_token_id=0)
        assert sync.receive(engine) == 1 and sync.receive(engine) is None
    transport.barrier(layout.world)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
