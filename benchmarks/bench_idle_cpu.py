"""CPU used by ranks that wait for a message: agentrl's polling wait vs a blocking MPI receive.

    mpirun -n 3 python benchmarks/bench_idle_cpu.py --seconds 10

Rank 0 does nothing but sleep for --seconds, then sends each waiting rank a message.
Ranks 1..N-1 wait for it, first with `comm.recv` (blocking, as most MPI code does),
then with `agentrl.transport.recv`. Each waiter's process CPU time / wall time is the
fraction of a core it burned while idle. Prints a table (medians over waiters).
"""

import argparse
import statistics
import time

from mpi4py import MPI

from agentrl import transport
from agentrl.transport import Tag


def measure(wait) -> float:
    wall, cpu = time.perf_counter(), time.process_time()
    wait()
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    results = {}
    for name, wait in (
        ("blocking recv (pkl5)", lambda: transport.pickled(world).recv(source=0, tag=Tag.TRAJECTORIES)),
        ("agentrl transport.recv", lambda: transport.recv(world, 0, Tag.TRAJECTORIES)),
    ):
        transport.barrier(world)
        if rank == 0:
            time.sleep(args.seconds)
            for dest in range(1, size):
                transport.send(world, "wake up", dest, Tag.TRAJECTORIES)
        else:
            results[name] = measure(wait)
    gathered = world.gather(results, root=0)
    if rank == 0:
        print(f"idle wait of {args.seconds:.0f} s, {size - 1} waiting ranks on {MPI.Get_processor_name()}")
        print(f"{'wait':<26} {'core used (median)':>20} {'max':>8}")
        for name in gathered[1]:
            values = [g[name] for g in gathered[1:]]
            print(f"{name:<26} {statistics.median(values):>19.1%} {max(values):>8.1%}")


if __name__ == "__main__":
    transport.abort_on_exception(main)()
