"""What every rank does before its role starts (`start_run`): rank 0 prepares the run folder, checks the model and
prints the layout, and every rank learns the start step and the data positions; then this rank's threads and
seeds. The parts each role is built from are the roles' own (agentrl/roles/)."""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentrl import transport
from agentrl.config import Config, save_config
from agentrl.data.episode_dump import drop_dumps_from
from agentrl.errors import UserError
from agentrl.evaluation.report import drop_reports_from
from agentrl.layout import Layout, Role, pinned_cores
from agentrl.run.plan import show_layout
from agentrl.run.preflight import agree_on_chat_format
from agentrl.run.tokenizer_corpus import env_texts


@dataclass(frozen=True)
class RunStart:
    """Where a run starts, the same on every rank: its first step, the number of walks over data.train (`shards`)
    and each walk's rows consumed at that step (`data_start`, None without data.train)."""

    step: int
    shards: int
    data_start: list[int] | None


def start_run(config: Config, layout: Layout) -> RunStart:
    """Every rank, in turn with the others: rank 0 prepares the run folder, checks the model and prints the layout;
    every rank gets the start step and the data positions."""
    start_step = transport.agree_on_root(layout.world, lambda: prepare_run_dir(config, layout))
    if layout.role is not Role.ENV:  # env ranks load no model: no torch there unless an env imports it
        from agentrl.models.loading import import_model_code

        import_model_code()  # side by side, before rank 0's model check imports the same and the others wait
    transport.agree_on_root(layout.world, lambda: (check_model(config), show_layout(config, layout)))
    detected = config.chat.format is None
    agree_on_chat_format(layout.world, config)  # before any rank renders, parses or trains
    if detected and config.chat.format is not None and layout.world.Get_rank() == 0:
        save_config(config, Path(config.run_dir) / "config.yaml")  # the resolved config names the detected family
    shards = data_shards(config, layout)
    data_start = None
    if config.data.train:  # the same on every rank
        data_start = transport.agree_on_root(layout.world, lambda: data_positions(config, start_step, shards))
    return RunStart(start_step, shards, data_start)


def prepare_run_dir(config: Config, layout: Layout) -> int:
    """Rank 0, in the claimed run folder: decide the start step and save the config (the model is checked next,
    by `check_model`, once every rank has its model code imported)."""
    from agentrl.models.hub import refuse_missing_model
    from agentrl.tracking import check_installed

    run_dir = Path(config.run_dir)
    for note in config.notes:
        print(f"agentrl: config: {note}", flush=True)
    check_installed(config.logging.backends)
    refuse_missing_model(config.model)
    start_step = resume_step(config) if not config.policies else policies_start(config)
    if dropped := drop_dumps_from(run_dir, start_step):
        print(f"agentrl: removed {dropped} episode dump(s) of steps from {start_step} on (they are redone)", flush=True)
    if dropped := drop_reports_from(run_dir, start_step):
        print(f"agentrl: removed {dropped} eval report(s) and dump(s) of steps from {start_step} on", flush=True)
    save_config(config, run_dir / "config.yaml")
    return start_step


def check_model(config: Config) -> None:
    """Rank 0: build the tiny model or check that model.path loads (UserError if not)."""
    from agentrl.models.loading import ensure_model  # imports torch

    if config.policies:
        from agentrl.run.policy_start import ensure_policy_models

        ensure_policy_models(config)
        return
    ensure_model(config.model, lambda: env_texts(config))
    check_scoring_model(config)


def check_scoring_model(config: Config) -> None:
    """Rank 0: the reward section's model (reward.model.path, reward.judge.path) loads, before a rank loads it."""
    from agentrl.models.loading import check_loadable

    if config.reward.model is not None:
        check_loadable(config.reward.model.path, "reward.model.path")
    elif config.reward.judge is not None and config.reward.judge.path is not None:
        check_loadable(config.reward.judge.path, "reward.judge.path")


def policies_start(config: Config) -> int:
    """A multi-policy run's start step (agentrl/policies/start.py)."""
    from agentrl.run.policy_start import policies_resume_step

    return policies_resume_step(config)


def resume_step(config: Config) -> int:
    """The step to start at: 0, or the newest complete checkpoint's with resume=true; refusals are UserErrors."""
    from agentrl.trainer import checkpoint

    run_dir = Path(config.run_dir)
    folders = checkpoint.step_folders(run_dir)
    if not config.resume:
        if folders:
            raise UserError(
                f"run_dir {run_dir} already has checkpoint step {folders[0][0]} "
                f"({len(folders)} checkpoint folder(s) in {checkpoint.checkpoint_dir(run_dir)}); pass resume=true "
                "to continue it, or choose a new run_dir=... so nothing is overwritten"
            )
        return 0
    found, damaged = checkpoint.newest_complete(run_dir)
    if found is None and damaged:
        listed = "; ".join(f"{bad.path.name}: {bad.problem}" for bad in damaged)
        raise UserError(
            f"resume=true, but none of the {len(damaged)} checkpoint folder(s) in {checkpoint.checkpoint_dir(run_dir)} "
            f"is complete ({listed}). Nothing was changed. Restore a good copy of one, or move them away to start "
            "this run_dir over at step 0"
        )
    if found is None:
        print(f"agentrl: resume=true but {run_dir} has no checkpoint; starting at step 0", flush=True)
        return 0
    for bad in damaged:
        print(f"agentrl: skipping damaged checkpoint {bad.path}: {bad.problem} (left in place)", flush=True)
    if found.note:
        print(f"agentrl: checkpoint {found.path} {found.note}", flush=True)
    print(f"agentrl: resuming from {found.path} at step {found.step}", flush=True)
    if found.step >= config.steps:
        print(f"agentrl: step {found.step} is already at steps={config.steps}; raise steps=... to train on", flush=True)
    return found.step


def data_shards(config: Config, layout: Layout) -> int:
    """How many walks over data.train there are: one per rollout rank, or one for all (rollout.dispatch=dynamic)."""
    if layout.single_process or config.rollout.dispatch == "dynamic":
        return 1
    return len(layout.rollout_ranks)


def data_positions(config: Config, start_step: int, shards: int) -> list[int]:
    """Rank 0: each rollout rank's rows consumed at `start_step`, from that checkpoint's data state."""
    from agentrl.data.loading import load_rows
    from agentrl.data.recorder import read_data_state
    from agentrl.data.tasks import resume_positions
    from agentrl.trainer import checkpoint

    if not start_step:
        return [0] * shards
    saved = read_data_state(checkpoint.step_path(config.run_dir, start_step))
    if saved is None:
        print(f"agentrl: checkpoint step {start_step} holds no data position; data.train starts at its first row")
    positions, note = resume_positions(saved, len(load_rows(config.data.train)), shards)
    if note:
        print(f"agentrl: {note}", flush=True)
    return positions


YIELD_NICENESS = 10  # runtime.yield_to_trainer: how far below the trainer the other ranks run


def set_threads(config: Config, layout: Layout, only_if_loaded: bool = False) -> None:
    """torch's threads, and with runtime.pin_cores this rank's cores; `only_if_loaded`: torch's threads only where
    something imported it (an env rank whose envs do without torch)."""
    threads = config.runtime.torch_threads or max(1, (os.cpu_count() or 1) // layout.node_size)
    if config.runtime.pin_cores and layout.gpu is None and hasattr(os, "sched_setaffinity"):
        roles_on_node = _roles_on_node(layout)
        available = sorted(os.sched_getaffinity(0))
        cores = pinned_cores(available, roles_on_node, layout.role)
        if cores is not None:
            os.sched_setaffinity(0, cores)
            if layout.is_trainer_leader:
                others = pinned_cores(available, roles_on_node, Role.ROLLOUT)
                print(f"agentrl: runtime.pin_cores: trainer ranks on cores {cores}, the others on {others}", flush=True)
            sharing = sum((role is Role.TRAINER) == (layout.role is Role.TRAINER) for role in roles_on_node)
            threads = config.runtime.torch_threads or max(1, len(cores) // sharing)
    if only_if_loaded and "torch" not in sys.modules:
        return
    import torch

    torch.set_num_threads(threads)


def yield_to_trainer(config: Config, layout: Layout) -> None:
    """runtime.yield_to_trainer: this rank's priority, before it starts any thread (Linux's nice is per thread, and
    threads inherit it)."""
    if not yields_to_trainer(config, layout, _roles_on_node(layout)):
        return
    if layout.role is not Role.TRAINER:
        os.nice(YIELD_NICENESS)
    elif layout.is_trainer_leader:
        print(
            f"agentrl: runtime.yield_to_trainer: the other ranks on this node run at nice +{YIELD_NICENESS}", flush=True
        )


def yields_to_trainer(config: Config, layout: Layout, roles_on_node: list[Role]) -> bool:
    """runtime.yield_to_trainer as it applies to this node: CPU ranks, a trainer among others, and (auto) running
    ahead on more ranks than cores."""
    setting = config.runtime.yield_to_trainer
    if setting is False or layout.gpu is not None or not hasattr(os, "nice"):
        return False
    if Role.TRAINER not in roles_on_node or all(role is Role.TRAINER for role in roles_on_node):
        return False
    if setting == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return config.rollout.max_staleness >= 1 and len(roles_on_node) > cores
    return True


def _roles_on_node(layout: Layout) -> list[Role]:
    return [role for role, node in zip(layout.roles, layout.nodes, strict=True) if node == layout.node]


def seed_everything(seed: int, torch_too: bool = True) -> None:
    """Python's, numpy's and (`torch_too`) torch's generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if torch_too:
        seed_torch(seed)


def seed_torch(seed: int, only_if_loaded: bool = False) -> None:
    """torch's generator; `only_if_loaded`: only where something imported torch (an env rank's plugin, say)."""
    if only_if_loaded and "torch" not in sys.modules:
        return
    import torch

    torch.manual_seed(seed)
