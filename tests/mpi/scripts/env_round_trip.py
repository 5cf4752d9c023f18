"""mpirun -n 2: rank 1 is an env rank, rank 0 a rollout rank reaching it through MPIEnvClient.

env_round_trip.py answers   batches in flight at once each get their own answers (closes awaited or not); the reply
                            thread ends
env_round_trip.py rings    both sides poll only every 2 s: the doorbells they ring make the turns fast anyway
env_round_trip.py silent    the env rank takes a request and never answers: the call times out
env_round_trip.py raise     the env rank raises while the rollout rank waits: the job aborts
env_round_trip.py exit      the env rank's process exits while the rollout rank waits: the job ends
"""

import asyncio
import os
import sys
import time

from mpi4py import MPI

from agentrl import transport
from agentrl.env.client import MPIEnvClient
from agentrl.env.host import EnvHost
from agentrl.roles.env import serve
from agentrl.transport import Tag

ROLLOUT, ENV = 0, 1


class EchoEnv:
    def reset(self, seed=None, options=None):
        return f"seed {seed}", {}

    def step(self, action):
        time.sleep(0.001 * (hash(action) % 3))  # ragged env work
        return f"echo {action}", 0.0, False, False, {}

    def close(self):
        pass


async def episode(client, key: int, turns: int) -> list[str]:
    observations = [(await client.call("reset", key, key, None)).value[0]]
    for turn in range(turns):
        await asyncio.sleep(0.002 * (key % 4))  # episodes reach the env in different ticks: several batches in flight
        observations.append((await client.call("step", key, f"{key}:{turn}")).value[0])
    if key % 2:
        await client.call("close", key)
    else:  # not awaited, as the agent loop closes: the env rank still closes it (counted there)
        client.close(key)
    return observations


def answers(world) -> None:
    if world.Get_rank() == ENV:
        counts = serve(world, EnvHost("echo", factory=lambda _id: EchoEnv()), [ROLLOUT])
        assert counts == {"requests": 2 * 24 * 7, "started": 48, "finished": 48, "failed": 0, "open": 0}, counts
        return
    client = MPIEnvClient(world, ENV, timeout_s=30)

    async def run_all():
        return await asyncio.gather(*(episode(client, key, turns=5) for key in range(24)))

    for round_index in range(2):  # a second event loop: the reply thread serves whichever loop awaits
        results = asyncio.run(run_all())
        for key, observations in enumerate(results):
            assert observations == [f"seed {key}"] + [f"echo {key}:{turn}" for turn in range(5)], observations
        print(f"round {round_index}: 24 episodes x 5 turns, every answer reached its own episode")
    assert client.receiver.is_alive()
    client.shutdown()
    assert not client.receiver.is_alive()
    print("reply thread ended at shutdown")


def rings(world) -> None:
    every_2_s = transport.Polling(fraction=0.0, min_s=2.0, max_s=2.0)
    if world.Get_rank() == ENV:
        serve(world, EnvHost("echo", factory=lambda _id: EchoEnv()), [ROLLOUT], polling=every_2_s)
        return
    client = MPIEnvClient(world, ENV, timeout_s=30, polling=every_2_s)
    started = time.monotonic()
    observations = asyncio.run(episode(client, key=0, turns=10))
    seconds = time.monotonic() - started
    assert observations == ["seed 0"] + [f"echo 0:{turn}" for turn in range(10)], observations
    client.shutdown()
    print(f"12 round trips in {seconds:.2f} s")


def silent(world) -> None:
    if world.Get_rank() == ENV:
        transport.recv(world, ROLLOUT, Tag.ENV_REQUEST)  # taken, never answered
        transport.recv(world, ROLLOUT, Tag.ENV_REQUEST)  # goodbye
        return
    client = MPIEnvClient(world, ENV, timeout_s=30)
    client.timeout_s = 2.0
    started = time.monotonic()
    try:
        asyncio.run(client.call("reset", 0, 0, None))
    except TimeoutError as error:
        print(f"timed out after {time.monotonic() - started:.1f} s: {error}")
    client.shutdown()
    assert not client.receiver.is_alive()


def peer_gone(world, how: str) -> None:
    if world.Get_rank() == ENV:
        transport.recv(world, ROLLOUT, Tag.ENV_REQUEST)
        time.sleep(0.5)
        if how == "raise":
            raise RuntimeError("injected failure on the env rank")
        sys.stderr.write("env rank exits\n")
        sys.stderr.flush()
        os._exit(3)
    client = MPIEnvClient(world, ENV, timeout_s=600)
    asyncio.run(client.call("reset", 0, 0, None))  # never answered
    print("the call returned")


def main():
    world = MPI.COMM_WORLD
    mode = sys.argv[1]
    if mode == "answers":
        answers(world)
    elif mode == "rings":
        rings(world)
    elif mode == "silent":
        silent(world)
    else:
        peer_gone(world, mode)


if __name__ == "__main__":
    transport.abort_on_exception(main)()
