"""Two ranks as two simulated nodes, each its node's leader. `busy`: both beat while their main thread is busy
(Python loops, sleeps) longer than the timeout, then stop cleanly. `silent`: rank 1 joins the leaders'
communicator but never beats; rank 0 must abort the job within the timeout, saying so."""

import sys
import time

from mpi4py import MPI

from agentrl.run.liveness import Liveness

mode, timeout_s = sys.argv[1], float(sys.argv[2])
world = MPI.COMM_WORLD
rank = world.Get_rank()
if mode == "busy":
    liveness = Liveness(world, [0, 1], None, timeout_s)
    until = time.monotonic() + 2 * timeout_s
    while time.monotonic() < until:  # holds the GIL but for Python's switch interval
        sum(range(10_000))
    time.sleep(timeout_s)
    liveness.stop()
    print(f"rank {rank} stopped cleanly", flush=True)
elif rank == 0:
    liveness = Liveness(world, [0, 1], None, timeout_s)
    time.sleep(60)
else:
    from agentrl.transport import allgather_object

    allgather_object(world, 0)  # Liveness's pid exchange
    world.Split(color=0, key=rank)  # the leaders' communicator, joined, but no beats
    time.sleep(60)
