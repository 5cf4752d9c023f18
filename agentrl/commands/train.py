"""`agentrl train CONFIG [key=value ...]`: every rank runs this; the layout decides which role it takes
(agentrl/roles/).

User errors found before training starts raise on every rank (agentrl/cli.py prints them once); later ones
abort the job. The imports follow the order of the start: a stop signal is a graceful stop and a refused run
folder is refused within a second, before the slow imports of the roles.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from agentrl.run import preempt

if TYPE_CHECKING:
    from agentrl.config import Config


def add_arguments(parser) -> None:
    parser.add_argument("config", help="YAML config, e.g. launch/configs/quickstart.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.group_size=8 steps=50")


def main(args) -> int:
    from mpi4py import MPI

    from agentrl.config import load_config
    from agentrl.layout import assign_roles
    from agentrl.run.claim import claim
    from agentrl.run.preflight import refuse_unusable_env
    from agentrl.transport import Failed, run_entry_point

    config = load_config(args.config, args.overrides)
    preempt.install()  # before the slow imports: a stop signal from now on is a graceful stop
    world = MPI.COMM_WORLD
    assign_roles(config.layout, world.Get_size())  # the layout against the job's size, the same answer on every rank
    command = ["agentrl", "train", args.config, *args.overrides]

    def run():
        refuse_unusable_env(world, config)  # before anything is written: a broken env leaves no run folder
        lock = claim(config, command, world)  # before the slow imports: a refusal comes in a second
        try:
            return train(config, command)
        finally:  # inside the wrapper: given back before an abort ends this process
            if lock is not None:
                lock.release()

    try:
        done = run_entry_point(run)
    except Failed as failure:
        return failure.exit_code
    return 0 if done >= config.steps else preempt.EXIT_STOPPED


def train(config: Config, command: list[str] | None = None) -> int:
    """Run this rank's role; returns the steps done on every rank (fewer than config.steps: stopped by a signal).

    The caller holds the run_dir lock (`agentrl.run.claim.claim`); `command` is how the user
    started the run, for the resume hint.
    """
    from agentrl.errors import RefusedOnEveryRank, UserError
    from agentrl.layout import Layout
    from agentrl.run.liveness import Liveness

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


def _run_role(config: Config, layout, command: list[str] | None, started: float) -> int:
    from agentrl import transport
    from agentrl.roles import run_role
    from agentrl.run.start import start_run
    from agentrl.run.summary import RunSummary

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
