"""mpirun -n 2: rank 1 installs SGLangEngine's SIGQUIT handler and gets SIGQUIT, as when an SGLang
child dies; rank 0 waits in a barrier. The whole job must end at once with the reason, not hang."""

import os
import signal

from mpi4py import MPI

from agentrl import transport
from agentrl.engine.sglang import abort_job_on_child_crash


def main():
    world = MPI.COMM_WORLD
    if world.Get_rank() == 1:
        signal.signal(signal.SIGQUIT, abort_job_on_child_crash)
        os.kill(os.getpid(), signal.SIGQUIT)
    transport.barrier(world)
    print(f"rank {world.Get_rank()} passed the barrier", flush=True)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
