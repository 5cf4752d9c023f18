"""mpirun -n 3: a rank that joins a polled collective late rings the ranks already waiting in it.

Ranks 0 and 1 form a sub-communicator (as trainer ranks do) and share doorbells over the world, as a training
job's ranks do at the start (agentrl/roles/__init__.py); rank 2 stays out. Rank 0 enters an allreduce and its
twin broadcast at once, with polling sleeps that double up to 30 s; rank 1 joins LATE_S later. Each rank prints
how long after rank 1 joined rank 0 came out: with the ring, a few milliseconds; polled alone (the code before
the ring), 2.3 s, when rank 0's doubling sleeps next woke it.

Usage: collective_ring.py
"""

import time

import numpy as np
from mpi4py import MPI

from agentrl import node_wakeup, transport
from agentrl.node_wakeup import Doorbell

LATE_S = 1.0
LONG_SLEEP_S = 30.0


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    bell = Doorbell.create()
    node_wakeup.share(bell, transport.allgather_object(world, bell.address), world.Get_group())
    pair = world.Split(0 if rank < 2 else MPI.UNDEFINED, rank)
    for what in ("allreduce", "broadcast"):
        transport.barrier(world)
        joined = np.zeros(1)
        if rank == 1:
            time.sleep(LATE_S)
        if pair != MPI.COMM_NULL:
            joined[0] = time.time() if rank == 1 else 0.0
            if what == "allreduce":
                joined = transport.allreduce_sum(pair, joined, max_sleep_s=LONG_SLEEP_S)
            else:
                transport.bcast_array(pair, joined, root=1, max_sleep_s=LONG_SLEEP_S)
            if rank == 0:
                print(f"{what}: rank 0 out {time.time() - joined[0]:.3f} s after rank 1 joined", flush=True)
    transport.barrier(world)


if __name__ == "__main__":
    main()
