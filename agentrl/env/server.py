"""The env role's loop: serve batched reset/step/close requests from rollout ranks until each says goodbye."""

from __future__ import annotations

from collections.abc import Callable

from agentrl import transport
from agentrl.env.host import EnvHost
from agentrl.transport import Tag


def serve(
    comm,
    host: EnvHost,
    clients: list[int],
    after_batch: Callable[[], None] | None = None,
    polling: transport.Polling | None = transport.ENV_REQUEST_POLLING,
) -> dict:
    """Answer requests until every client has sent None; returns counters. `after_batch` runs after each reply.

    The wait for a request polls per `polling` (transport.Backoff); None: sleeps that double to 5 ms.
    """
    from mpi4py import MPI

    open_clients = set(clients)
    requests = 0
    while open_clients:
        batch, client = transport.recv(comm, MPI.ANY_SOURCE, Tag.ENV_REQUEST, polling=polling)
        if batch is None:
            open_clients.discard(client)
            continue
        requests += len(batch)
        results = host.handle_batch([(op, (client, key), *args) for op, key, *args in batch])
        transport.send(comm, results, client, Tag.ENV_REPLY)
        if after_batch is not None:
            after_batch()
    return {"requests": requests, **host.counts()}
