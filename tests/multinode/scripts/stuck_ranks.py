"""Every rank waits for a message that never comes, with runtime.peer_timeout_s = argv[1]: cut a node's link
and time how long mpiexec takes to end (docs/slurm.md#node-faults)."""

import sys

from mpi4py import MPI

from agentrl import transport
from agentrl.run.liveness import Liveness
from agentrl.transport import Tag

world = MPI.COMM_WORLD
hosts = world.allgather(MPI.Get_processor_name())
liveness = Liveness(world, [hosts.index(host) for host in hosts], hosts, float(sys.argv[1]))
print(f"rank {world.Get_rank()} on {hosts[world.Get_rank()]} waiting", flush=True)
transport.recv(world, MPI.ANY_SOURCE, Tag.EVAL)
