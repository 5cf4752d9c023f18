"""What a sum over ranks costs the way agentrl waits for it: polled from the start, or every rank arriving polled
and then MPI's blocking call (`agentrl.transport.allreduce_sum`), beside the blocking call alone.

    mpirun -n 2 python benchmarks/collective_wait.py              # 200 calls of each, the tiny model's gradient
    mpirun -n 2 python benchmarks/collective_wait.py --floats 1000000 --calls 50

Rows: a polled non-blocking `Iallreduce` (each round of the collective advances only when a rank looks, between
sleeps); `Allreduce` alone (spins while waiting); `transport.allreduce_sum` (a polled, rung `Ibarrier`, then the
blocking `Allreduce`); the same three for a 4-number sum; and the 130k-float sums with the last rank 2 ms late each
call (busy work), where waiting matters. Prints milliseconds a call, the median of 5 rounds (rank 0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--floats", type=int, default=130_000, help="floats summed (the tiny model's gradient)")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()

    from mpi4py import MPI

    from agentrl import node_wakeup, transport
    from agentrl.node_wakeup import Doorbell

    comm = MPI.COMM_WORLD
    bell = Doorbell.create()
    node_wakeup.share(bell, transport.allgather_object(comm, None if bell is None else bell.address), comm.Get_group())
    late = comm.Get_size() - 1

    def polled(array):
        out = np.empty_like(array)
        transport.wait_collective(comm, comm.Iallreduce(array, out, op=MPI.SUM), "an allreduce")
        return out

    def blocking(array):
        out = np.empty_like(array)
        comm.Allreduce(array, out, op=MPI.SUM)
        return out

    def lateness(function):
        def call(array):
            if comm.Get_rank() == late:
                started = time.perf_counter()
                while time.perf_counter() - started < 0.002:
                    pass
            return function(array)

        return call

    gradient, small = np.ones(args.floats, dtype=np.float32), np.ones(4)
    cases = [
        (f"{args.floats} floats, polled Iallreduce", polled, gradient),
        (f"{args.floats} floats, blocking Allreduce", blocking, gradient),
        (f"{args.floats} floats, transport.allreduce_sum", lambda a: transport.allreduce_sum(comm, a), gradient),
        ("4 numbers, polled Iallreduce", polled, small),
        ("4 numbers, blocking Allreduce", blocking, small),
        ("4 numbers, transport.allreduce_sum", lambda a: transport.allreduce_sum(comm, a), small),
        (f"{args.floats} floats, a rank 2 ms late, polled Iallreduce", lateness(polled), gradient),
        (
            f"{args.floats} floats, a rank 2 ms late, transport.allreduce_sum",
            lateness(lambda a: transport.allreduce_sum(comm, a)),
            gradient,
        ),
    ]
    rows = []
    for name, function, array in cases:
        for _ in range(10):
            function(array)
        rounds = []
        for _ in range(5):
            comm.Barrier()
            started = time.perf_counter()
            for _ in range(args.calls // 5):
                function(array)
            rounds.append((time.perf_counter() - started) / (args.calls // 5))
        rows.append((name, statistics.median(rounds)))
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} ranks, {args.calls} calls a row\n")
        print("| call | ms a call |\n|---|---|")
        for name, seconds in rows:
            print(f"| {name} | {seconds * 1e3:.3f} |")


if __name__ == "__main__":
    main()
