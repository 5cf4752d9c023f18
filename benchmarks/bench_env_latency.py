"""What an env rank adds to each turn over an in-process env, and what its waiting costs when idle.

    mpirun -n 2 python benchmarks/bench_env_latency.py            # 1 rollout rank + 1 env rank
    mpirun -n 3 python benchmarks/bench_env_latency.py --turns 50 # 2 rollout ranks share the env rank

Rank 0 is the env rank (a no-op env: reset and step return at once); the other ranks are
rollout ranks running episodes against a fake engine that "generates" every pending turn
in one batch after --generate-ms (a sleep: no model), as the torch engine batches a
tick's requests. Only the `env.call("step")` of each turn is timed, from the call to its
result. The same episodes run against an in-process env (LocalEnvClient) in the same
run; the added latency is the median over turns of the env rank minus that of in-process.

Two wait strategies run side by side, interleaved round by round:
- before: the code of 2026-11-24 before doorbells: both sides sleep a fraction of the time
  waited so far between polls (transport.ENV_REPLY_POLLING, transport.ENV_REQUEST_POLLING),
  one Iprobe per poll, no doorbell (MPIEnvClient and serve with doorbells=False, and
  transport.try_recv swapped for its one-probe version while this strategy runs).
- doorbell (new): the same schedules, two Iprobes per poll, and each side rings the
  other's doorbell (agentrl.node_wakeup) after sending, which cuts the wait short.

Idle CPU uses bench_idle_cpu.py's method: process CPU time / wall time over a wait, in
percent of one core. "env rank" waits for a request that comes after --idle seconds;
"rollout rank" waits for the reply to a step that the env takes --idle seconds to answer.
Short idle waits (like the gap of one generation) are repeated to fill about 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time

from mpi4py import MPI

from agentrl import transport
from agentrl.env.client import LocalEnvClient, MPIEnvClient
from agentrl.env.host import EnvHost
from agentrl.roles.env import serve
from agentrl.transport import Tag

ENV_RANK = 0
STRATEGIES = ("before", "doorbell (new)")


class NoOpEnv:
    def __init__(self, step_s: float = 0.0):
        self.step_s = step_s

    def reset(self, seed=None, options=None):
        return "start", {}

    def step(self, action):
        if self.step_s:
            time.sleep(self.step_s)
        return "ok", 0.0, False, False, {}

    def close(self):
        pass


class FakeEngine:
    """Answers every generate call pending in one tick together, `seconds` later (no model)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.pending: list[asyncio.Future] = []

    async def generate(self) -> str:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.pending:
            loop.call_later(self.seconds, self._finish)
        self.pending.append(future)
        return await future

    def _finish(self) -> None:
        batch, self.pending = self.pending, []
        for future in batch:
            future.set_result("guess")


REQUEST_POLLING = transport.ENV_REQUEST_POLLING  # --request-min-ms sets its floor


def one_probe_try_recv(comm, source, tag):
    """transport.try_recv as it was before doorbells: one Iprobe per poll."""
    from mpi4py import MPI

    if not comm.Iprobe(source=source, tag=int(tag)):
        return False, None, None
    status = MPI.Status()
    message = transport.pickled(comm).improbe(source=source, tag=int(tag), status=status)
    if message is None:
        return False, None, None
    return True, message.recv(), status.Get_source()


TWO_PROBE_TRY_RECV = transport.try_recv


def use_strategy(strategy: str) -> None:
    transport.try_recv = one_probe_try_recv if strategy == STRATEGIES[0] else TWO_PROBE_TRY_RECV


def serve_with(strategy: str, comm, host, clients) -> dict:
    use_strategy(strategy)
    return serve(comm, host, clients, polling=REQUEST_POLLING, doorbells=strategy != STRATEGIES[0])


def make_client(strategy: str | None, comm, timeout_s: float = 60.0):
    if strategy is None:
        return LocalEnvClient(EnvHost("noop", factory=lambda _id: NoOpEnv()))
    use_strategy(strategy)
    return MPIEnvClient(comm, ENV_RANK, timeout_s, doorbells=strategy != STRATEGIES[0])


async def run_episodes(client, episodes: int, turns: int, generate_s: float, tag: str) -> list[float]:
    """Seconds each turn's env step took, over `episodes` episodes played side by side."""
    engine = FakeEngine(generate_s)
    waits: list[float] = []

    async def episode(index: int) -> None:
        key = (tag, index)
        await client.call("reset", key, index, None)
        for _ in range(turns):
            action = await engine.generate()
            started = time.perf_counter()
            result = await client.call("step", key, action)
            waits.append(time.perf_counter() - started)
            assert result.ok, result.error
        await client.call("close", key)

    await asyncio.gather(*(episode(i) for i in range(episodes)))
    return waits


def measure_latency(comm, strategy: str, episodes: int, turns: int, generate_s: float, tag: str):
    """(in-process waits, env-rank waits) on a rollout rank; the env rank's share of a core while serving on it."""
    clients = list(range(1, comm.Get_size()))
    transport.barrier(comm)
    if comm.Get_rank() == ENV_RANK:
        host = EnvHost("noop", factory=lambda _id: NoOpEnv())
        transport.barrier(comm)  # the rollout ranks have run their in-process episodes
        return core_fraction(lambda: serve_with(strategy, comm, host, clients))
    local = asyncio.run(run_episodes(make_client(None, comm), episodes, turns, generate_s, tag))
    transport.barrier(comm)
    client = make_client(strategy, comm)
    remote = asyncio.run(run_episodes(client, episodes, turns, generate_s, tag))
    client.shutdown()
    return local, remote


def core_fraction(wait) -> float:
    wall, cpu = time.perf_counter(), time.process_time()
    wait()
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def idle_env_rank(comm, strategy: str, seconds: float) -> float | None:
    """The env rank's share of a core while it waits `seconds` for its clients' goodbye."""
    clients = list(range(1, comm.Get_size()))
    transport.barrier(comm)
    if comm.Get_rank() == ENV_RANK:
        host = EnvHost("noop", factory=lambda _id: NoOpEnv())
        return core_fraction(lambda: serve_with(strategy, comm, host, clients))
    time.sleep(seconds)
    transport.send(comm, None, ENV_RANK, Tag.ENV_REQUEST)
    return None


def idle_rollout_rank(comm, strategy: str, seconds: float) -> float | None:
    """A rollout rank's share of a core while it waits for a step the env takes `seconds` to answer."""
    clients = list(range(1, comm.Get_size()))
    transport.barrier(comm)
    if comm.Get_rank() == ENV_RANK:
        host = EnvHost("slow", factory=lambda _id: NoOpEnv(step_s=seconds), call_timeout_s=seconds + 60)
        serve_with(strategy, comm, host, clients)
        return None

    async def one_slow_step(client) -> float:
        await client.call("reset", "slow", 0, None)
        fraction = await _core_fraction_async(client.call("step", "slow", "wait"))
        await client.call("close", "slow")
        return fraction

    client = make_client(strategy, comm)
    fraction = asyncio.run(one_slow_step(client))
    client.shutdown()
    return fraction


async def _core_fraction_async(awaitable) -> float:
    wall, cpu = time.perf_counter(), time.process_time()
    await awaitable
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def _ratio(before_ms: float, new_ms: float) -> str:
    """before/new, or '-' where the new added latency is below what the medians resolve (under 0.05 ms)."""
    return f"{before_ms / new_ms:.1f}x" if new_ms >= 0.05 else "-"


def median_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=60, help="turns per episode, over all rounds")
    parser.add_argument("--batches", default="1,64", help="episodes in flight per rollout rank")
    parser.add_argument("--generate-ms", type=float, default=20.0, help="fake engine time per turn")
    parser.add_argument("--rounds", type=int, default=3, help="strategies alternate this many times")
    parser.add_argument("--idle", default="0.2,5", help="idle waits to measure CPU over, seconds")
    parser.add_argument(
        "--request-min-ms",
        type=float,
        default=transport.ENV_REQUEST_POLLING.min_s * 1e3,
        help="the env rank's shortest sleep between polls for a request",
    )
    args = parser.parse_args()
    global REQUEST_POLLING
    REQUEST_POLLING = dataclasses.replace(transport.ENV_REQUEST_POLLING, min_s=args.request_min_ms / 1e3)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("run under mpirun with 2 or more ranks: mpirun -n 2 python benchmarks/bench_env_latency.py")
    batches = [int(b) for b in args.batches.split(",")]
    idles = [float(s) for s in args.idle.split(",")]
    turns_per_round = max(1, args.turns // args.rounds)

    local: dict = {}
    remote: dict = {}
    idle: dict = {}  # CPU shares: ("env" | "rollout", strategy, seconds) idle, ("serving", strategy, episodes)
    for round_index in range(args.rounds):
        for episodes in batches:
            for strategy in STRATEGIES if round_index % 2 == 0 else STRATEGIES[::-1]:
                tag = f"{round_index}-{episodes}-{strategy}"
                waits = measure_latency(comm, strategy, episodes, turns_per_round, args.generate_ms / 1e3, tag)
                if isinstance(waits, float):
                    idle.setdefault(("serving", strategy, episodes), []).append(waits)
                else:
                    local.setdefault((strategy, episodes), []).extend(waits[0])
                    remote.setdefault((strategy, episodes), []).extend(waits[1])

    for seconds in idles:
        repeats = max(1, round(2.0 / seconds))
        for repeat in range(repeats):
            for strategy in STRATEGIES if repeat % 2 == 0 else STRATEGIES[::-1]:
                for role, measure in (("env", idle_env_rank), ("rollout", idle_rollout_rank)):
                    fraction = measure(comm, strategy, seconds)
                    if fraction is not None:
                        idle.setdefault((role, strategy, seconds), []).append(fraction)

    gathered = comm.gather((local, remote, idle), root=0)
    if rank != 0:
        return
    pooled_local, pooled_remote, pooled_idle = {}, {}, {}
    for part_local, part_remote, part_idle in gathered:
        for pooled, part in ((pooled_local, part_local), (pooled_remote, part_remote), (pooled_idle, part_idle)):
            for key, values in part.items():
                pooled.setdefault(key, []).extend(values)

    load = os.getloadavg()[0]
    print(
        f"env rank round trip: {size - 1} rollout rank(s) + 1 env rank on {MPI.Get_processor_name()} "
        f"({os.cpu_count()} cores, load average {load:.1f}); no-op env, fake engine {args.generate_ms:g} ms per turn; "
        f"waits: requests {REQUEST_POLLING}, replies {transport.ENV_REPLY_POLLING}"
    )
    print(f"{turns_per_round * args.rounds} turns per episode per rank, {args.rounds} interleaved rounds; medians")
    print()
    header = f"{'wait strategy':<16}" + "".join(
        f" {f'{b} ep: in-proc':>15} {'env rank':>9} {'added':>8}" for b in batches
    )
    print("per-turn env.step latency, ms")
    print(header)
    added: dict = {}
    for strategy in STRATEGIES:
        row = f"{strategy:<16}"
        for episodes in batches:
            in_process = median_ms(pooled_local[(strategy, episodes)])
            over_mpi = median_ms(pooled_remote[(strategy, episodes)])
            added[(strategy, episodes)] = over_mpi - in_process
            row += f" {in_process:>15.3f} {over_mpi:>9.3f} {over_mpi - in_process:>8.3f}"
        print(row)
    before, new = STRATEGIES
    ratio = "".join(f" {'':>15} {'':>9} {_ratio(added[(before, b)], added[(new, b)]):>8}" for b in batches)
    print(f"{'before / new':<16}{ratio}")
    print()
    print("env rank CPU while serving those turns, % of one core (median over rounds)")
    print(f"{'wait strategy':<16}" + "".join(f" {f'{b} ep':>10}" for b in batches))
    for strategy in STRATEGIES:
        shares = [statistics.median(pooled_idle[("serving", strategy, b)]) for b in batches]
        print(f"{strategy:<16}" + "".join(f" {share:>10.1%}" for share in shares))
    print()
    print("idle CPU, % of one core (median over ranks and repeats)")
    print(f"{'wait strategy':<16}" + "".join(f" {f'env {s:g}s':>10} {f'rollout {s:g}s':>12}" for s in idles))
    for strategy in STRATEGIES:
        row = f"{strategy:<16}"
        for seconds in idles:
            env_cpu = statistics.median(pooled_idle[("env", strategy, seconds)])
            rollout_cpu = statistics.median(pooled_idle[("rollout", strategy, seconds)])
            row += f" {env_cpu:>10.1%} {rollout_cpu:>12.1%}"
        print(row)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
