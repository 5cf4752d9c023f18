"""mpirun -n 2: a rollout rank's episodes reach the trainer rank token for token, mask for mask."""

import sys

import numpy as np
from mpi4py import MPI

from agentrl import transport
from agentrl.config import from_dict
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.roles.rollout_parts import rollout_worker
from agentrl.trajectory import pack
from agentrl.transport import Tag


def main():
    world = MPI.COMM_WORLD
    config = from_dict({"model": {"path": sys.argv[1]}, "rollout": {"tasks_per_step": 2, "group_size": 4}})
    if world.Get_rank() == 1:
        worker = rollout_worker(config, LocalEnvClient(EnvHost("guess_number", {})), 0, 1)
        episodes, _ = worker.collect(step=0)
        transport.send(world, pack(episodes), 0, Tag.TRAJECTORIES)
        reference = [(e.tokens, e.loss_mask, [float(x) for x in e.logprobs]) for e in episodes]
    else:
        batch, _ = transport.recv(world, 1, Tag.TRAJECTORIES)
        reference = None
    reference = transport.bcast_object(world, reference, root=1)
    if world.Get_rank() == 0:
        for i, (tokens, mask, logprobs) in enumerate(reference):
            span = slice(batch["offsets"][i], batch["offsets"][i + 1])
            assert batch["tokens"][span].tolist() == tokens
            assert batch["loss_mask"][span].tolist() == mask
            np.testing.assert_array_equal(batch["logprobs"][span], np.float32(logprobs))
        print(f"{len(reference)} episodes arrived exactly", flush=True)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
