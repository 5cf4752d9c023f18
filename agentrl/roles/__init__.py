"""One file per role, each read top to bottom: setup, loop, shutdown; `run_role` takes this rank's.

- `trainer.run_trainer`: take batches, train, publish weights, log, checkpoint;
- `rollout.run_rollout`: generate episodes and ship them, in lockstep or running ahead;
- `env.run_env`: host envs for rollout ranks;
- `scorer.run_scorer`: score rollout ranks' finished episodes with the one copy of the scoring model;
- `hybrid.run_hybrid`: all of it in turns in each process: world size 1 (pdb works anywhere), or layout.hybrid's
  ranks, a share of each step's tasks each.

What the trainer side and a rollout rank are built from, each part given the config sections it reads:
`trainer_parts` and `rollout_parts`.
"""

from __future__ import annotations

from agentrl import node_wakeup, transport
from agentrl.config import Config
from agentrl.layout import Layout, Role
from agentrl.node_wakeup import Doorbell
from agentrl.run.freed_memory import keep_freed_memory
from agentrl.run.start import RunStart, seed_everything, set_threads, yield_to_trainer


def run_role(config: Config, layout: Layout, start: RunStart) -> tuple[int | None, dict[int, float] | None]:
    """This rank's role, from `start`; the steps done and the success rate at each step where it trained (the
    trainer leader, or the single process), else None. Each role's module is imported only on its ranks: env
    ranks load no torch unless an env does."""
    yield_to_trainer(config, layout)
    if config.runtime.keep_freed_memory:
        keep_freed_memory()
    bell = Doorbell.create()  # the hand-overs between roles ring it (agentrl/node_wakeup.py)
    addresses = transport.allgather_object(layout.world, None if bell is None else bell.address)
    node_wakeup.share(bell, addresses, layout.world.Get_group())
    if layout.role is Role.ENV and not layout.single_process:
        from agentrl.roles.env import run_env

        run_env(config, layout)  # no torch here unless an env loads it (run_env then seeds it)
        return None, None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    set_threads(config, layout)
    seed_everything(config.seed + layout.rank)
    if layout.role is Role.SCORER and not layout.single_process:
        from agentrl.roles.scorer import run_scorer

        run_scorer(config, layout)
        return None, None
    if config.policies:  # several policies in one job: agentrl/policies/
        from agentrl.roles.policies import run_policy_role

        return run_policy_role(config, layout, start)
    if layout.single_process or layout.hybrid:
        from agentrl.roles.hybrid import run_hybrid

        return run_hybrid(config, layout, start)
    if layout.role is Role.TRAINER:
        from agentrl.roles.trainer import run_trainer

        return run_trainer(config, layout, start.step)
    from agentrl.roles.rollout import run_rollout

    run_rollout(config, layout, start)
    return None, None
