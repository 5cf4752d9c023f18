"""mpirun -n 3: a rollout rank takes shared-memory weights while the trainer leader is busy computing.

The trainer leader publishes a version and then computes for 4 s without calling MPI (as it
trains the next step while rollout ranks run ahead). The readers' handoff barriers need the
trainer's part of them: it must complete in the background, so each rollout rank holds the
version well before the trainer's next MPI call.

Usage: weight_sync_shm_busy_trainer.py MODEL_DIR
"""

import sys
import time

from agentrl import transport
from agentrl.config import LayoutConfig
from agentrl.engine.torch_engine import TorchEngine
from agentrl.layout import Layout, Role
from agentrl.models.loading import load_causal_lm
from agentrl.weights.shm import SharedMemoryWeights

BUSY_S = 4.0


def main():
    layout = Layout(LayoutConfig(trainer=1, rollout=2, env=0), gpus_per_node=0)
    model = load_causal_lm(sys.argv[1])
    sync = SharedMemoryWeights(layout.weight_comm, layout.node, bucket_mb=0.02)
    published = None
    if layout.is_trainer_leader:
        sync.send([(n, p.detach()) for n, p in model.named_parameters()], 1)
        published = time.monotonic()
        time.sleep(BUSY_S)  # a training step: no MPI call
        sync.stop()
    elif layout.role is Role.ROLLOUT:
        engine = TorchEngine(model, pad_token_id=0)
        assert sync.receive(engine) == 1
        held = time.monotonic()
        assert sync.receive(engine) is None
    published = transport.bcast_object(layout.world, published, root=0)
    if layout.role is Role.ROLLOUT:
        print(f"rank {layout.rank} held version 1 {held - published:.2f} s after the trainer published it", flush=True)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
