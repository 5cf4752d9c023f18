"""mpirun -n 3: a stop in the middle of a dynamic-dispatch step, then every rank closes the queue and ends MPI.

Rank 0 serves the queue (one task per step). Rank 1's claim is answered but never read (a stop
cancelled it), and it says goodbye while rank 0 still serves. Then rank 2's claim is held (the
step's task is out) and it claims for the next step too; rank 0 stops serving without answering
either, and rank 2 closes only then. After `close`, MPI_Finalize must find no message left unreceived on any rank.
"""

import asyncio
import contextlib

from mpi4py import MPI

from agentrl import transport
from agentrl.data.tasks import SeededTasks
from agentrl.rollout.dispatch import DispatchClient, DispatchServer
from agentrl.transport import Tag


def claim(step: int) -> dict:
    return {"step": step, "want": 1, "running": 0, "kept": 0, "dropped": 0}


async def serve_until_stopped(server: DispatchServer) -> None:
    with contextlib.suppress(TimeoutError):  # rank 2 never ends the step: the stop does
        await asyncio.wait_for(server.serve(), timeout=2.0)


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if rank == 0:
        server = DispatchServer(world, [1, 2], tasks_per_step=1, max_extra_rounds=1, source=SeededTasks(0))
        server.open(0)
        asyncio.run(serve_until_stopped(server))
        print(f"rank 0: held {len(server.held)}, later {len(server.later)}, gone {sorted(server.gone)}", flush=True)
        transport.send(world, "stopped", 2, Tag.TRAJECTORIES)
        server.close()
    else:
        client = DispatchClient(world, 0)
        if rank == 1:
            transport.send(world, claim(0), 0, Tag.TASKS)
            transport.wait_until(lambda: transport.probe(world, 0, Tag.TASK_REPLY))  # answered; never read
            transport.send(world, "go", 2, Tag.TRAJECTORIES)
        else:
            transport.recv(world, 1, Tag.TRAJECTORIES)
            transport.send(world, claim(0), 0, Tag.TASKS)  # the step's one task is out: held
            transport.send(world, claim(1), 0, Tag.TASKS)  # running ahead: waits for step 1
            transport.recv(world, 0, Tag.TRAJECTORIES)  # stopped after rank 0 stopped serving
        print(f"rank {rank}: dropped {client.close()} answers", flush=True)
    transport.finalize()
    print(f"rank {rank}: finalized", flush=True)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
