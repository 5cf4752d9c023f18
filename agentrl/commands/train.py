"""`agentrl train`: every rank runs this; the layout decides which role it takes (agentrl/roles/)."""

from __future__ import annotations

import time

from agentrl import transport
from agentrl.config import Config
from agentrl.errors import RefusedOnEveryRank, UserError
from agentrl.layout import Layout
from agentrl.roles import run_role
from agentrl.run import preempt
from agentrl.run.liveness import Liveness
from agentrl.run.start import start_run
from agentrl.run.summary import RunSummary


def train(config: Config, command: list[str] | None = None) -> int:
    """Run this rank's role; returns the steps done on every rank (fewer than config.steps: stopped by a signal).

    The caller holds the run_dir lock (`agentrl.run.claim.claim`); `command` is how the user
    started the run, for the resume hint.
    """
    started = time.monotonic()
    preempt.install()
    try:
        layout = Layout(config.layout, rollout_gpus=config.rollout.engine.gpus)
    except UserError as error:  # the same sizes on every rank, so the same error everywhere
        raise RefusedOnEveryRank(str(error)) from None
    if layout.single_process and config.rollout.max_staleness:
        raise RefusedOnEveryRank(
            f"rollout.max_staleness={config.rollout.max_staleness} overlaps generation with training, which needs "
            "separate trainer and rollout ranks, but this is a single process; launch with mpirun -n 3 or more "
            "(layout: trainer, rollout, env), or set rollout.max_staleness=0"
        )
    liveness = Liveness(layout.world, layout.nodes, layout.hosts, config.runtime.peer_timeout_s)
    try:
        done = _run_role(config, layout, command, started)
    except RefusedOnEveryRank:  # every rank leaves alike; any other error aborts the job (transport.abort_on_exception)
        liveness.stop()
        raise
    liveness.stop()
    return done


def _run_role(config: Config, layout: Layout, command: list[str] | None, started: float) -> int:
    start = start_run(config, layout)
    done, success_by_step = run_role(config, layout, start)
    transport.barrier(layout.world)
    if layout.is_trainer_leader and not layout.single_process:
        preempt.take_forwarded(layout.world)  # a request that came after the last step boundary
    preempt.finish_forwarding()
    done = transport.bcast_object(layout.world, done)  # rank 0 is the trainer leader
    if layout.rank == 0:
        summary = RunSummary(config, layout.size, start.step, done, time.monotonic() - started, command)
        print(summary.text(success_by_step or {}, preempt.reason()), flush=True)
    return done
