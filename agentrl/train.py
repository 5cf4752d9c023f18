"""`agentrl train`: every rank runs this; the layout decides which role loop it enters."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np

from agentrl import preempt, transport
from agentrl.config import Config, save_config
from agentrl.env.client import LocalEnvClient, MPIEnvClient
from agentrl.env.host import EnvHost
from agentrl.env.preflight import check_env_config
from agentrl.env.registry import make
from agentrl.errors import RefusedOnEveryRank, UserError
from agentrl.evaluation.report import drop_from as drop_eval_from
from agentrl.layout import Layout, Role, engine_gpus, format_plan, pinned_cores, plan
from agentrl.rollout.chat import tools_as_text
from agentrl.rollout.episode_dump import drop_from as drop_dumps_from
from agentrl.run_summary import RunSummary
from agentrl.supervise import restart_count


def train(config: Config, command: list[str] | None = None) -> int:
    """Run this rank's role; returns the steps done on every rank (fewer than config.steps: stopped by a signal).

    The caller holds the run_dir lock (`agentrl.run_dir.claim`); `command` is how the user
    started the run, for the resume hint.
    """
    from transformers.utils import logging as hf_logging

    started = time.monotonic()
    hf_logging.disable_progress_bar()
    preempt.install()
    try:
        layout = Layout(config.layout, rollout_gpus=engine_gpus(config))
    except UserError as error:  # the same sizes on every rank, so the same error everywhere
        raise RefusedOnEveryRank(str(error)) from None
    if layout.single_process and config.rollout.max_staleness:
        raise RefusedOnEveryRank(
            f"rollout.max_staleness={config.rollout.max_staleness} overlaps generation with training, which needs "
            "separate trainer and rollout ranks, but this is a single process; launch with mpirun -n 3 or more "
            "(layout: trainer, rollout, env), or set rollout.max_staleness=0"
        )
    start_step = transport.agree_on_root(layout.world, lambda: prepare_run_dir(config, layout))
    data_start = None
    if config.data.train:  # the same on every rank
        shards = data_shards(config, layout)
        data_start = transport.agree_on_root(layout.world, lambda: data_positions(config, start_step, shards))
    set_threads(config, layout)
    seed_everything(config.seed + layout.rank)

    done, success_by_step = None, None
    if layout.single_process:
        done, success_by_step = run_single_process(config, layout, start_step, data_start)
    elif layout.role is Role.TRAINER:
        done, success_by_step = run_trainer(config, layout, start_step)
    elif layout.role is Role.ROLLOUT:
        run_rollout(config, layout, start_step, data_start)
    else:
        run_env(config, layout)
    transport.barrier(layout.world)
    if layout.is_trainer_leader and not layout.single_process:
        preempt.take_forwarded(layout.world)  # a request that came after the last step boundary
    preempt.finish_forwarding()
    done = transport.bcast_object(layout.world, done)  # rank 0 is the trainer leader
    if layout.rank == 0:
        summary = RunSummary(config, layout.size, start_step, done, time.monotonic() - started, command)
        print(summary.text(success_by_step or {}, preempt.reason()), flush=True)
    return done


def prepare_run_dir(config: Config, layout: Layout) -> int:
    """Rank 0, in the claimed run folder: decide the start step, save the config, make sure the model loads."""
    from agentrl.trainer.model import ensure_model

    run_dir = Path(config.run_dir)
    for note in config.notes:
        print(f"agentrl: config: {note}", flush=True)
    start_step = resume_step(config)
    if dropped := drop_dumps_from(run_dir, start_step):
        print(f"agentrl: removed {dropped} episode dump(s) of steps from {start_step} on (they are redone)", flush=True)
    if dropped := drop_eval_from(run_dir, start_step):
        print(f"agentrl: removed {dropped} eval report(s) and dump(s) of steps from {start_step} on", flush=True)
    save_config(config, run_dir / "config.yaml")
    ensure_model(config, lambda: env_texts(config))
    print(f"agentrl: run_dir={run_dir} world={layout.size}", flush=True)
    # This job's real nodes (numbered 0, 1, ... in rank order) and GPUs: the table shows what each rank binds and
    # the weight transport every rank resolves from those placements.
    nodes = [sorted(set(layout.nodes)).index(node) for node in layout.nodes]
    gpus, mapped, in_place = engine_gpus(config), config.weights.shm_mapped, config.trains_in_window
    transport = config.weights.transport
    rows = plan(config.layout, layout.size, None, layout.gpus_per_node, gpus, transport, mapped, in_place, nodes)
    print(format_plan(rows, layout.single_process), flush=True)
    return start_step


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


def task_source(config: Config, shard: int, shards: int, data_start: list[int] | None):
    """This rollout rank's tasks: its share of data.train's rows from its saved position, or the env's seeds."""
    from agentrl.data.loading import load_rows
    from agentrl.data.tasks import DatasetTasks, SeededTasks

    if not config.data.train:
        return SeededTasks(config.seed)
    rows = load_rows(config.data.train)
    return DatasetTasks(rows, config.data.train, config.seed, shard, shards, data_start[shard], config.data.shuffle)


def env_texts(config: Config, episodes: int = 64) -> list[str]:
    """Observations and random digit actions from a few env episodes (on data.train's first rows, if set): the
    tiny tokenizer's corpus."""
    rng = random.Random(0)
    texts = []
    env = make(config.env.id, **config.env.kwargs)
    rows = None
    if config.data.train:
        from agentrl.data.loading import load_rows

        rows = load_rows(config.data.train)
        episodes = min(episodes, len(rows))
    for seed in range(episodes):
        observation, _ = env.reset(seed=seed) if rows is None else env.reset(seed=seed, options=rows[seed])
        texts.append(observation)
        for _ in range(config.rollout.max_turns):
            action = str(rng.randint(0, 99))
            observation, _, terminated, truncated, _ = env.step(action)
            texts += [action, observation]
            if terminated or truncated:
                break
    if config.env.system_prompt:
        texts.append(config.env.system_prompt)
    if getattr(env, "tools", None):
        texts.append(tools_as_text(env.tools))
    return texts


def env_host(config: Config, check: bool = True) -> EnvHost:
    """The host of this rank's envs; `check`: build one first, so a failure on this rank stops the job (rank 0's
    check passed, but this rank may lack a package or a file)."""
    if check:  # an env that needs a dataset row was reset with one by rank 0's check; here it is only built
        check_env_config(config.env.id, config.env.kwargs, reset=not (config.data.train or config.data.val))
    return EnvHost(config.env.id, config.env.kwargs, call_timeout_s=config.runtime.env_step_timeout_s)


def set_threads(config: Config, layout: Layout) -> None:
    import torch

    threads = config.runtime.torch_threads or max(1, (os.cpu_count() or 1) // layout.node_size)
    if config.runtime.pin_cores and layout.gpu is None and hasattr(os, "sched_setaffinity"):
        roles_on_node = [role for role, node in zip(layout.roles, layout.nodes, strict=True) if node == layout.node]
        available = sorted(os.sched_getaffinity(0))
        cores = pinned_cores(available, roles_on_node, layout.role)
        if cores is not None:
            os.sched_setaffinity(0, cores)
            if layout.is_trainer_leader:
                others = pinned_cores(available, roles_on_node, Role.ROLLOUT)
                print(f"agentrl: runtime.pin_cores: trainer ranks on cores {cores}, the others on {others}", flush=True)
            sharing = sum((role is Role.TRAINER) == (layout.role is Role.TRAINER) for role in roles_on_node)
            threads = config.runtime.torch_threads or max(1, len(cores) // sharing)
    torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _make_trainer(config: Config, layout: Layout, start_step: int, group=None):
    from agentrl.trainer import checkpoint
    from agentrl.trainer.model import load_tokenizer
    from agentrl.trainer.policy_trainer import PolicyTrainer

    resumed_from = checkpoint.step_path(config.run_dir, start_step) if start_step else None
    trainer = PolicyTrainer(config, str(resumed_from or config.model.path), layout.device, group)
    if resumed_from is not None:
        checkpoint.load_state(
            resumed_from, trainer.optimizer, trainer.scheduler, trainer.model, extra_state=trainer.extra_state
        )
    return trainer, load_tokenizer(config.model.path)


def _logger(config: Config, start_step: int):
    from agentrl.logging import RunLogger

    return RunLogger(config.run_dir, config.steps, start_step, config.logging.progress, restarts=restart_count())


def run_single_process(config: Config, layout: Layout, start_step: int, data_start) -> tuple[int, dict[int, float]]:
    """World size 1: rollout, envs and training take turns in this process (pdb works anywhere)."""
    from agentrl.data.recorder import StepRecorder
    from agentrl.failures import FailureTally, abort_if_failing
    from agentrl.rollout.shipping import sample_texts
    from agentrl.rollout.worker import RolloutWorker
    from agentrl.trainer.loop import train_loop
    from agentrl.trajectory import pack
    from agentrl.weights.base import InProcessWeightCopy

    trainer, tokenizer = _make_trainer(config, layout, start_step)
    tasks = task_source(config, 0, 1, data_start)
    worker = RolloutWorker(config, LocalEnvClient(env_host(config, check=False)), 0, 1, layout.device, tasks)
    sync = InProcessWeightCopy(worker.engine)
    sync.send(trainer.named_weights(), start_step)
    recorder = StepRecorder(config.run_dir, config.rollout.dump_episodes)

    def collect(step: int):
        episodes, stats = worker.collect(step)
        abort_if_failing(step, FailureTally.of(episodes), config.runtime.abort_on_failed_fraction)
        dumped = worker.episode_records(step) if config.rollout.dump_episodes else []
        recorder.record(step, [tasks.position()], dumped)
        return pack(episodes), stats, sample_texts(config, step, episodes)

    logger = _logger(config, start_step)
    evaluate = None
    if config.eval.enabled:
        from agentrl.evaluation.report import RunEvaluation
        from agentrl.evaluation.runner import Evaluator

        evaluator = Evaluator(config, worker)
        evaluate = RunEvaluation(config, lambda step: [evaluator.run(step, config.eval.dump_episodes)], logger)
    done = train_loop(
        config, trainer, tokenizer, collect, sync, start_step, layout.role_comm, logger, [recorder], evaluate
    )
    logger.close()
    return done, logger.success_by_step


def run_trainer(config: Config, layout: Layout, start_step: int) -> tuple[int, dict[int, float] | None]:
    """Steps done, and on the leader the success rate logged at each step."""
    from agentrl.data.recorder import StepRecorder
    from agentrl.trainer.loop import receive_from_rollouts, train_loop
    from agentrl.trainer.model import init_trainer_group
    from agentrl.weights import make_weight_sync
    from agentrl.weights.base import GatherOnly

    group = init_trainer_group(layout.role_comm, layout.device)
    trainer, tokenizer = _make_trainer(config, layout, start_step, group)
    weights = GatherOnly()  # other trainer ranks join the leader's gathers of sharded (FSDP) weights
    if layout.is_trainer_leader:
        weights = make_weight_sync(config, layout)
        if config.rollout.max_staleness:
            from agentrl.weights.announce import AnnouncedWeights

            weights = AnnouncedWeights(weights, layout.world, layout.rollout_ranks)
        weights.place(trainer.model)
    weights.send(trainer.named_weights(), start_step)
    logger = _logger(config, start_step) if layout.is_trainer_leader else None
    recorder = StepRecorder(config.run_dir, config.rollout.dump_episodes) if layout.is_trainer_leader else None
    collect = receive_from_rollouts(layout, config.runtime.abort_on_failed_fraction, recorder)
    extra = [recorder] if recorder is not None else []
    evaluate = None
    if config.eval.enabled and layout.is_trainer_leader:
        from agentrl.evaluation.report import RunEvaluation, receive_results

        evaluate = RunEvaluation(config, receive_results(layout), logger)
    done = train_loop(
        config, trainer, tokenizer, collect, weights, start_step, layout.role_comm, logger, extra, evaluate
    )
    if config.rollout.max_staleness and done < config.steps:  # stopped: batches generated ahead are still coming
        from agentrl.rollout.ahead import discard_batches_ahead

        discarded = discard_batches_ahead(layout)
        if logger is not None and discarded:
            print(
                f"agentrl: discarded {discarded} batch(es) generated ahead of step {done}; a resumed run generates "
                "their tasks again",
                flush=True,
            )
    if logger is None:
        return done, None
    logger.close()
    return done, logger.success_by_step


def run_rollout(config: Config, layout: Layout, start_step: int, data_start: list[int] | None) -> None:
    from agentrl.rollout import worker
    from agentrl.weights import make_weight_sync

    env_rank = layout.env_rank_for(layout.rank)
    if env_rank is None:
        env_client = LocalEnvClient(env_host(config))
    else:
        env_client = MPIEnvClient(layout.world, env_rank, config.runtime.env_step_timeout_s)
    sync = make_weight_sync(config, layout)  # a process-group sync connects at its first receive
    shards = data_shards(config, layout)
    shard = layout.rollout_ranks.index(layout.rank) if shards > 1 else 0
    tasks = task_source(config, shard, shards, data_start)
    worker.run(config, layout, start_step, env_client, sync, tasks)


def run_env(config: Config, layout: Layout) -> None:
    from agentrl.env.server import serve

    leader = layout.trainer_ranks[0]
    serve(
        layout.world,
        env_host(config),
        layout.rollout_ranks_served_by(layout.rank),
        after_batch=lambda: preempt.forward(layout.world, leader),
    )
