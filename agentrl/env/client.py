"""How the agent loop reaches environments: in-process, or on an env rank over MPI.

Both clients are async and gather every request made in one event-loop tick into one
batch: on an env rank a turn of 128 episodes costs one round trip, and in-process the
batch's calls run side by side under one deadline.
"""

from __future__ import annotations

import asyncio
from collections import deque

from agentrl import transport
from agentrl.env.host import EnvHost, EnvResult
from agentrl.transport import Tag


class TickBatchingClient:
    """Gathers the env calls made in one event-loop tick and hands them to `dispatch` as one batch."""

    def __init__(self):
        self.pending: list[tuple[tuple, asyncio.Future]] = []

    async def call(self, op: str, key, *args) -> EnvResult:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self.pending:
            loop.call_soon(self._flush)
        self.pending.append(((op, key, *args), future))
        return await future

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        self.dispatch([request for request, _ in batch], [future for _, future in batch])

    def dispatch(self, requests: list[tuple], futures: list[asyncio.Future]) -> None:
        raise NotImplementedError


class LocalEnvClient(TickBatchingClient):
    """Environments live in this process; one tick's calls run as one `EnvHost.handle_batch`."""

    def __init__(self, host: EnvHost):
        super().__init__()
        self.host = host

    def dispatch(self, requests, futures) -> None:
        for future, result in zip(futures, self.host.handle_batch(requests), strict=True):
            future.set_result(result)

    def shutdown(self) -> None:
        for key in list(self.host.envs):
            self.host.handle("close", key)


class MPIEnvClient(TickBatchingClient):
    """Environments live on env rank `server`; one tick's calls travel as one message.

    Replies arrive in the order the batches were sent (MPI keeps order per sender and
    tag), so one receiver task resolves the oldest batch in flight with each reply.
    """

    def __init__(self, comm, server: int, timeout_s: float):
        super().__init__()
        self.comm, self.server = comm, server
        # The env rank ends any call that outlives `timeout_s` and replies; it may first be
        # serving another rollout rank's batch, so wait longer before declaring it lost.
        self.timeout_s = 2 * timeout_s + 30
        self.in_flight: deque[list[asyncio.Future]] = deque()
        self.receiver: asyncio.Task | None = None

    def dispatch(self, requests, futures) -> None:
        transport.send(self.comm, requests, self.server, Tag.ENV_REQUEST)
        self.in_flight.append(futures)
        if self.receiver is None or self.receiver.done():
            self.receiver = asyncio.ensure_future(self._receive())

    async def _receive(self) -> None:
        while self.in_flight:
            backoff = transport.Backoff(self.timeout_s, f"env rank {self.server} to answer")
            try:
                while not (reply := transport.try_recv(self.comm, self.server, Tag.ENV_REPLY))[0]:
                    await asyncio.sleep(backoff.next_delay())
            except TimeoutError as error:
                for futures in self.in_flight:
                    for future in futures:
                        future.set_exception(error)
                self.in_flight.clear()
                return
            for future, result in zip(self.in_flight.popleft(), reply[1], strict=True):
                future.set_result(result)

    def shutdown(self) -> None:
        transport.send(self.comm, None, self.server, Tag.ENV_REQUEST)
