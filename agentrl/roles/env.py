"""The env role: host this rank's envs (or run its rollout ranks' agent programs) and answer batched requests from
its rollout ranks until each says goodbye."""

from __future__ import annotations

from collections.abc import Callable

from agentrl import transport
from agentrl.config import Config
from agentrl.env.host import EnvHost
from agentrl.gateway.agent_host import AgentHost
from agentrl.layout import Layout
from agentrl.node_wakeup import Doorbell
from agentrl.run import preempt, startup_gc
from agentrl.run.preflight import check_env_config
from agentrl.run.start import seed_everything, seed_torch, set_threads
from agentrl.transport import Tag


def run_env(config: Config, layout: Layout) -> None:
    leader = layout.trainer_ranks[0]
    seed = config.seed + layout.rank
    seed_everything(seed, torch_too=False)
    # agent programs run here, each against its rollout rank's gateway; an env host builds one env first, so its
    # plugin's imports (torch or not) have happened
    host = AgentHost(config.agent) if config.agent.enabled else env_host(config)
    set_threads(config, layout, only_if_loaded=True)
    seed_torch(seed, only_if_loaded=True)
    startup_gc.settle()
    serve(
        layout.world,
        host,
        layout.rollout_ranks_served_by(layout.rank),
        after_batch=lambda: preempt.forward(layout.world, leader),
    )
    if isinstance(host, EnvHost):
        host.close_idle()


def env_host(config: Config, check: bool = True) -> EnvHost:
    """The host of this rank's envs (an env rank's, or a rollout rank's own); `check`: build one first, so a failure
    on this rank stops the job (rank 0's check passed, but this rank may lack a package or a file)."""
    if check:  # an env that needs a dataset row was reset with one by rank 0's check; here it is only built
        check_env_config(config.env.id, config.env.kwargs, reset=not (config.data.train or config.data.val))
    return EnvHost(
        config.env.id,
        config.env.kwargs,
        call_timeout_s=config.runtime.env_step_timeout_s,
        inline_quick_calls=config.runtime.env_quick_calls_inline,
        chat_format=config.chat.format,  # the family start-up found (agentrl.run.start.check_chat_format)
        reuse=config.env.reuse_instances,
    )


def serve(
    comm,
    host: EnvHost | AgentHost,
    clients: list[int],
    after_batch: Callable[[], None] | None = None,
    polling: transport.Polling | None = transport.ENV_REQUEST_POLLING,
    doorbells: bool = True,
) -> dict:
    """Answer requests until every client has sent None; returns counters. `after_batch` runs after each reply.

    A request is `(calls, the client's doorbell address or None)`; the reply is `(results, this
    rank's doorbell address or None)`, and the client's doorbell is rung after it. The wait for a
    request polls per `polling` (transport.Backoff; None: sleeps that double to 5 ms), cut short
    when a client on this node rings (`doorbells`, agentrl.node_wakeup).
    """
    from mpi4py import MPI

    bell = Doorbell.create() if doorbells else None
    address = None if bell is None else bell.address
    open_clients = set(clients)
    requests = 0
    try:
        while open_clients:
            message, client = transport.recv(comm, MPI.ANY_SOURCE, Tag.ENV_REQUEST, polling=polling, doorbell=bell)
            if message is None:
                open_clients.discard(client)
                continue
            batch, client_bell = message
            requests += len(batch)
            results = host.handle_batch([(op, (client, key), *args) for op, key, *args in batch])
            transport.send(comm, (results, address), client, Tag.ENV_REPLY)
            if bell is not None:
                bell.ring(client_bell)
            if after_batch is not None:
                after_batch()
    finally:
        if bell is not None:
            bell.close()
    return {"requests": requests, **host.counts()}
