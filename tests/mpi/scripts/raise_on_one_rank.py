"""mpirun -n 3: rank 2 raises while the others wait for messages; the job must abort, not hang."""

import time

from mpi4py import MPI

from agentrl import transport
from agentrl.transport import Tag


def main():
    world = MPI.COMM_WORLD
    if world.Get_rank() == 2:
        time.sleep(0.5)
        raise RuntimeError("injected failure on rank 2")
    transport.recv(world, 2, Tag.TRAJECTORIES)  # never arrives


if __name__ == "__main__":
    transport.abort_on_exception(main)()
