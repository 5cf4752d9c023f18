"""`agentrl eval CONFIG [--checkpoint PATH] [--out DIR] [--dump] [key=value ...]`: evaluate a model folder.

The same SPMD program and layout as training (`mpirun -n N agentrl eval ...`): the rollout ranks load
the model from the folder and run their share of the eval split, env ranks serve their envs, the
trainer leader gathers the results and writes the report; other trainer ranks have nothing to do and
wait (`layout.trainer=1` spares them). World size 1 does everything in one process.

Writes to `--out` (default `run_dir/eval/checkpoint_step_NNNNNN` for a run's checkpoint, else
`run_dir/eval/model_NAME`): `report.json` (metrics, per-task results, the model, the eval config,
wall time), `tb/` (the `eval/` scalars at the checkpoint's step) and, with `--dump`,
`episodes/step_NNNNNN.jsonl` in the training dumps' format.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from agentrl import transport
from agentrl.trainer.folders import STEP_NAME, model_folder


@dataclass(frozen=True)
class Target:
    model: str  # the folder (or hub id) the rollout ranks load
    step: int  # the checkpoint's training step (0 for a model that is not a run's checkpoint)
    out: str
    note: str | None = None


def resolve_target(config, checkpoint: str | None, out: str | None) -> Target:
    """Rank 0: the model folder to evaluate, its step and where the report goes; UserError for a bad path."""
    note = None
    if checkpoint is None:  # the config's own model.path: loaded (a tiny one built) by check_model next
        from agentrl.models.hub import refuse_missing_model

        refuse_missing_model(config.model)
        model, step = config.model.path, 0
    else:
        path, note = model_folder(checkpoint, f"--checkpoint {checkpoint}")
        match = STEP_NAME.match(path.name)
        model, step = str(path), int(match.group(1)) if match else 0
    name = Path(model).name
    run_checkpoint = Path(model).parent.name == "checkpoints" and STEP_NAME.match(name)
    label = f"checkpoint_step_{step:06d}" if run_checkpoint else f"model_{name}"
    default_out = Path(config.run_dir) / "eval" / label
    return Target(model, step, str(Path(out) if out else default_out), note)


def evaluate(config, target: Target, command: list[str]) -> dict | None:
    """This rank's part; the report on the rank that wrote it (rank 0), None elsewhere."""
    from transformers.utils import logging as hf_logging

    from agentrl.layout import Layout
    from agentrl.run.liveness import Liveness

    started = time.monotonic()
    hf_logging.disable_progress_bar()
    layout = Layout(config.layout, rollout_gpus=config.rollout.engine.gpus)
    liveness = Liveness(layout.world, layout.nodes, layout.hosts, config.runtime.peer_timeout_s)
    report = _evaluate_role(config, layout, target, started)
    liveness.stop()
    return report


def _evaluate_role(config, layout, target: Target, started: float) -> dict | None:
    from agentrl.layout import Role
    from agentrl.run.freed_memory import keep_freed_memory
    from agentrl.run.start import seed_everything, set_threads

    set_threads(config, layout)
    if config.runtime.keep_freed_memory:
        keep_freed_memory()
    seed_everything(config.seed + layout.rank)
    report = None
    if layout.single_process:
        evaluator = _evaluator(config, layout, target, None)
        report = _write(config, target, [evaluator.run(target.step, config.eval.dump_episodes)], layout, started)
        _close(evaluator.worker)
    elif layout.hybrid:  # every rank evaluates its share of the split; the leader writes the report
        evaluator = _evaluator(config, layout, target, None)
        messages = transport.allgather_object(layout.world, evaluator.run(target.step, config.eval.dump_episodes))
        if layout.is_trainer_leader:
            report = _write(config, target, messages, layout, started)
        _close(evaluator.worker)
    elif layout.is_trainer_leader:
        from agentrl.evaluation.report import receive_results

        report = _write(config, target, receive_results(layout)(target.step), layout, started)
    elif layout.role is Role.ROLLOUT:
        from agentrl.evaluation.report import send_results
        from agentrl.roles.rollout_parts import remote_env_client, scorer_client

        env_rank = layout.env_rank_for(layout.rank)
        client = None if env_rank is None else remote_env_client(config, layout, env_rank)
        scorer = scorer_client(config, layout)
        evaluator = _evaluator(config, layout, target, client, scorer)
        send_results(layout, target.step, evaluator.run(target.step, config.eval.dump_episodes))
        _close(evaluator.worker, scorer)
    elif layout.role is Role.ENV:
        from agentrl.roles.env import run_env

        run_env(config, layout)
    elif layout.role is Role.SCORER:
        from agentrl.roles.scorer import run_scorer

        run_scorer(config, layout)
    transport.barrier(layout.world)  # idle trainer ranks wait here, polling
    return report


def _close(worker, scorer=None) -> None:
    if worker.gateway is not None:
        worker.gateway.stop(worker.loop)
    if worker.env is not None:
        worker.env.shutdown()
    if scorer is not None:
        scorer.shutdown()


def _evaluator(config, layout, target: Target, env_client, scorer=None):
    from agentrl.env.client import LocalEnvClient
    from agentrl.evaluation.runner import Evaluator
    from agentrl.roles.env import env_host
    from agentrl.roles.rollout_parts import rollout_worker

    if env_client is None and not config.agent.enabled:  # agent programs play the env's part, through a gateway
        env_client = LocalEnvClient(env_host(config, check=not layout.single_process))
    shard = 0 if layout.single_process else layout.rollout_ranks.index(layout.rank)
    shards = 1 if layout.single_process else len(layout.rollout_ranks)
    worker = rollout_worker(config, env_client, shard, shards, layout.device, scorer=scorer)
    worker.engine.weight_version = target.step  # episodes and dumps say which checkpoint they came from
    return Evaluator(worker, shard, shards, eval_config=config.eval, data_val=config.data.val)


def _write(config, target: Target, messages: list[dict], layout, started: float) -> dict:
    from torch.utils.tensorboard import SummaryWriter

    from agentrl.data.episode_dump import write_step
    from agentrl.evaluation.report import scalars, summarize, write_json

    out = Path(target.out)
    wall = max(m["wall_s"] for m in messages)
    report = summarize(
        target.step, messages, target.model, wall, eval_config=config.eval, env=config.env, rollout=config.rollout
    )
    report["command_wall_time_s"] = time.monotonic() - started
    report["world_size"] = layout.size
    write_json(out / "report.json", report)
    writer = SummaryWriter(str(out / "tb"), purge_step=target.step)
    for name, value in scalars(report).items():
        writer.add_scalar(name, value, target.step)
    writer.close()
    if config.eval.dump_episodes:
        write_step(out, target.step, [record for m in messages for record in m["episodes"]])
    return report


def add_arguments(parser) -> None:
    parser.description = "agentrl eval CONFIG [--checkpoint PATH] [--out DIR] [--dump] [key=value ...]"
    parser.add_argument("config", help="the run's YAML config (env, layout, eval: split, n, sampling)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. eval.n=8 eval.temperature=1.0")
    parser.add_argument(
        "--checkpoint",
        help="RUN_DIR/checkpoints/step_N, a run folder (its newest) or a model folder; default model.path",
    )
    parser.add_argument("--out", help="folder for report.json, tb/ and episodes/ (default RUN_DIR/eval/<checkpoint>)")
    parser.add_argument("--dump", action="store_true", help="also write the episodes, as training's episode dumps")


def main(args) -> int:
    return run_eval(args.config, args.overrides, args.checkpoint, args.out, args.dump)


def run_eval(config_path: str, overrides: list[str], checkpoint: str | None, out: str | None, dump: bool) -> int:
    """`agentrl eval`: errors found before evaluating raise on every rank (the CLI prints them once)."""
    from mpi4py import MPI

    from agentrl.config import load_config
    from agentrl.evaluation.report import headline, table
    from agentrl.layout import Role, assign_roles
    from agentrl.run.preflight import agree_on_chat_format, refuse_unusable_env
    from agentrl.transport import Failed, run_entry_point

    config = load_config(config_path, [*overrides, *(["eval.dump_episodes=true"] if dump else [])])
    world = MPI.COMM_WORLD
    roles = assign_roles(config.layout, world.Get_size())  # the layout against -n, the same answer on every rank
    command = ["agentrl", "eval", config_path, *overrides]
    target = transport.agree_on_root(world, lambda: resolve_target(config, checkpoint, out))
    if target.note and world.Get_rank() == 0:
        print(f"agentrl: {target.note}", flush=True)
    config.model.path = target.model
    refuse_unusable_env(world, config, evaluating=True)
    if roles[world.Get_rank()] is not Role.ENV:
        from agentrl.models.loading import import_model_code  # imports torch: after the refusals above

        import_model_code()  # side by side, before rank 0's model check imports the same and the others wait
    if checkpoint is None:
        from agentrl.run.start import check_model

        transport.agree_on_root(world, lambda: check_model(config))
    agree_on_chat_format(world, config)
    try:
        report = run_entry_point(lambda: evaluate(config, target, command))
    except Failed as failure:
        return failure.exit_code
    if report is not None:
        print(table(report))
        print(f"agentrl: {headline(report)}")
        print(f"agentrl: model {target.model}; report {Path(target.out) / 'report.json'}")
        print(f"  tensorboard   tensorboard --logdir {Path(target.out) / 'tb'}", flush=True)
    return 0
