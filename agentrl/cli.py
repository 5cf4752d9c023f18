"""The `agentrl` command: train | eval | serve | sft | episodes-to-sft | export-merged | supervise | sweep | layout |
envs | algorithms | check-env | config-doc."""

from __future__ import annotations

import argparse
import os
import sys

from agentrl.errors import EXIT_USER_ERROR, UserError
from agentrl.run import startup_gc


def seconds_or_null(text: str) -> float | None:
    """An argparse type: positive seconds, or `null` for none (argparse names the function in its error)."""
    if text == "null":
        return None
    seconds = float(text)
    if seconds <= 0:
        raise ValueError(text)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train (run under mpirun/srun, or alone for single-process mode)")
    p.add_argument("config", help="YAML config, e.g. launch/configs/quickstart.yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.group_size=8 steps=50")

    p = sub.add_parser("sft", help="supervised fine-tuning on chat transcripts (mpirun for several ranks, or alone)")
    p.add_argument("config", help="SFT YAML config, e.g. launch/configs/sft_example.yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. sft.epochs=3 run_dir=runs/sft2")

    p = sub.add_parser(
        "episodes-to-sft",
        help="turn dumped RL episodes into SFT transcripts (successful ones by default)",
        description="agentrl episodes-to-sft RUN_DIR/episodes OUT.jsonl [--min-reward R] [--all]",
    )
    p.add_argument("episodes", help="a run's episodes folder (RUN_DIR/episodes, from rollout.dump_episodes=true)")
    p.add_argument("out", help="JSONL file to write, for sft.train")
    p.add_argument("--min-reward", type=float, default=None, help="keep only episodes with at least this reward")
    keep = p.add_mutually_exclusive_group()
    keep.add_argument(
        "--success-only", dest="success_only", action="store_true", default=True, help="keep successful ones (default)"
    )
    keep.add_argument("--all", dest="success_only", action="store_false", help="keep unsuccessful episodes too")

    p = sub.add_parser(
        "eval",
        help="evaluate a checkpoint or model folder on the eval split (mpirun for several ranks, or alone)",
        description="agentrl eval CONFIG [--checkpoint PATH] [--out DIR] [--dump] [key=value ...]",
    )
    p.add_argument("config", help="the run's YAML config (env, layout, eval: split, n, sampling)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. eval.n=8 eval.temperature=1.0")
    p.add_argument(
        "--checkpoint",
        help="RUN_DIR/checkpoints/step_N, a run folder (its newest) or a model folder; default model.path",
    )
    p.add_argument("--out", help="folder for report.json, tb/ and episodes/ (default RUN_DIR/eval/<checkpoint>)")
    p.add_argument("--dump", action="store_true", help="also write the episodes, as training's episode dumps")

    p = sub.add_parser(
        "serve",
        help="serve a model or a run's checkpoint over an OpenAI-compatible HTTP API (mpirun: several engines)",
        description="agentrl serve MODEL [--port 8000] [--model-name NAME] [engine key=value ...], e.g. "
        "agentrl serve runs/quickstart scheduler=continuous max_batch_size=64",
    )
    p.add_argument("model", help="RUN_DIR/checkpoints/step_N, a run folder (its newest) or a Hugging Face model folder")
    p.add_argument(
        "overrides",
        nargs="*",
        help="engine options as key=value, rollout.engine's fields: scheduler=continuous|batch max_batch_size=256 "
        "kv_cache_mb=256 cuda_graphs=auto; backend=sglang tp_size=1 mem_fraction_static=0.8 (GPU)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--model-name", help="the model id clients send (default: the folder's name, or RUN-stepN)")
    p.add_argument("--max-model-len", type=int, help="longest prompt + completion (default: the model's positions)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="parameter dtype")
    p.add_argument("--device", help="torch device for the torch engine (default cuda if available, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="the engines' sampling seed (rank r uses seed + r)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (info prints every request)")
    p.add_argument(
        "--peer-timeout-s",
        type=seconds_or_null,
        default=60.0,
        help="over several nodes: stop the job when a node is silent this long (a cut link); null: never",
    )

    p = sub.add_parser(
        "export-merged",
        help="write a LoRA checkpoint (adapter folder) merged into its base as a plain Hugging Face model folder",
        description="agentrl export-merged CHECKPOINT OUT [--dtype float32|bfloat16]",
    )
    p.add_argument("checkpoint", help="a LoRA run's RUN_DIR/checkpoints/step_N (or the run folder: its newest)")
    p.add_argument("out", help="folder to write (config.json, model.safetensors, tokenizer)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="dtype of the written weights")

    p = sub.add_parser(
        "supervise",
        help="run a training launch and relaunch it with resume=true when it crashes",
        description="agentrl supervise --max-restarts 3 -- mpirun -n 4 agentrl train CONFIG [key=value ...]",
    )
    p.add_argument("--max-restarts", type=int, default=3, help="restarts after a crash before giving up (default 3)")
    p.add_argument("--backoff-s", type=float, default=3.0, help="wait before the first restart; doubles each time")
    p.add_argument("launch", nargs=argparse.REMAINDER, help="-- then the launch command")

    p = sub.add_parser(
        "sweep",
        help="hyperparameter sweep: trials as run folders, Optuna grid/random/TPE, pruning, local or SLURM",
        description="agentrl sweep SPEC [--resume] [--slurm] | agentrl sweep status SWEEP_DIR (docs/sweeps.md)",
    )
    p.add_argument("target", help="the sweep spec YAML (e.g. launch/sweeps/quickstart_lr.yaml), or `status`")
    p.add_argument("path", nargs="?", help="with status: the sweep folder (the spec's sweep_dir)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in the spec's sweep_dir")
    p.add_argument("--slurm", action="store_true", help="submit it as a SLURM job array (slurm/sweep.sh)")
    p.add_argument("--sbatch", help="with --slurm: more sbatch options, e.g. '--time=02:00:00 --cpus-per-task=4'")

    p = sub.add_parser("layout", help="print which rank does what, without training")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--np", type=int, required=True, help="world size (ranks in the job)")
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="ranks per node (default: $AGENTRL_RANKS_PER_NODE, else all on one node)",
    )
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (0: CPU)")
    p.add_argument(
        "--hosts",
        default=None,
        help="each rank's host as MPICH's -hosts writes it, node0:2,node1:2 (nodes numbered by host, shown by name)",
    )
    p.add_argument("--eval", action="store_true", help="the plan of `agentrl eval` (trainer ranks report or idle)")

    sub.add_parser("envs", help="list registered environment ids")
    sub.add_parser("algorithms", help="list registered RL algorithms (algorithm.name) with what each is")

    p = sub.add_parser("check-env", help="validate an environment")
    p.add_argument("env_id")
    p.add_argument("--kwargs", default="{}", help="constructor kwargs as YAML/JSON, e.g. '{high: 20}'")
    p.add_argument("--data", help="rows to reset with (as data.train takes: jsonl, parquet, ...), e.g. for the qa env")

    p = sub.add_parser("config-doc", help="print the config reference as markdown")
    p.add_argument(
        "--write",
        metavar="FILE",
        help="replace the reference between FILE's config-reference markers instead (docs/config.md)",
    )

    args, extra = parser.parse_known_args(argv)  # key=value overrides may also follow options such as --np
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return COMMANDS[args.command](args)
    except UserError as error:  # raised alike on every rank of a job: rank 0 says it once
        from agentrl.transport import world_rank

        if world_rank() == 0:
            print(f"agentrl: {error}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR


def cmd_train(args) -> int:
    """User errors found before training starts raise on every rank (main prints them once); later ones abort."""
    from agentrl.config import load_config
    from agentrl.run import preempt
    from agentrl.run.claim import claim
    from agentrl.run.preflight import refuse_unusable_env
    from agentrl.transport import Failed, run_entry_point

    config = load_config(args.config, args.overrides)
    preempt.install()  # before the slow imports: a stop signal from now on is a graceful stop
    world = _check_world_size(config)
    command = ["agentrl", "train", args.config, *args.overrides]

    def run():
        refuse_unusable_env(world, config)  # before anything is written: a broken env leaves no run folder
        lock = claim(config, command, world)  # before the slow imports: a refusal comes in a second
        try:
            from agentrl.commands.train import train

            return train(config, command)
        finally:  # inside the wrapper: given back before an abort ends this process
            if lock is not None:
                lock.release()

    try:
        done = run_entry_point(run)
    except Failed as failure:
        return failure.exit_code
    return 0 if done >= config.steps else preempt.EXIT_STOPPED


def cmd_sft(args) -> int:
    """As cmd_train: errors before training raise on every rank, later ones abort the job."""
    from mpi4py import MPI

    from agentrl.run import preempt
    from agentrl.run.claim import claim
    from agentrl.sft.config import load_sft_config
    from agentrl.transport import Failed, run_entry_point

    config = load_sft_config(args.config, args.overrides)
    preempt.install()
    world = MPI.COMM_WORLD
    command = ["agentrl", "sft", args.config, *args.overrides]

    def run():
        lock = claim(config, command, world)
        try:
            from agentrl.layout import job_nodes
            from agentrl.run.liveness import Liveness
            from agentrl.commands.sft import run_sft

            liveness = Liveness(world, *job_nodes(world), config.runtime.peer_timeout_s)
            result = run_sft(config, world, command)
            liveness.stop()
            return result
        finally:
            if lock is not None:
                lock.release()

    try:
        done, total = run_entry_point(run)
    except Failed as failure:
        return failure.exit_code
    return 0 if done >= total else preempt.EXIT_STOPPED


def cmd_episodes_to_sft(args) -> int:
    from pathlib import Path

    from agentrl.sft.episodes import episodes_to_sft

    report = episodes_to_sft(args.episodes, args.out, args.success_only, args.min_reward)
    print(report.text(Path(args.out)))
    return 0


def _check_world_size(config):
    """The layout against the job's size, before anything is loaded (the same answer on every rank); the world."""
    from mpi4py import MPI

    from agentrl.layout import assign_roles

    assign_roles(config.layout, MPI.COMM_WORLD.Get_size())
    return MPI.COMM_WORLD


def cmd_eval(args) -> int:
    from agentrl.commands.eval import main as evaluate

    return evaluate(args.config, args.overrides, args.checkpoint, args.out, args.dump)


def cmd_serve(args) -> int:
    from agentrl.serve.command import main as serve

    return serve(args)


def cmd_export_merged(args) -> int:
    from agentrl.trainer.export import export_merged

    out = export_merged(args.checkpoint, args.out, args.dtype)
    print(f"agentrl: wrote the merged model to {out} (load it with from_pretrained, or as model.path)")
    return 0


def cmd_supervise(args) -> int:
    from agentrl.run.supervise import supervise

    startup_gc.settle()  # light, and as long-running as the job it watches
    command = args.launch[1:] if args.launch[:1] == ["--"] else args.launch
    return supervise(command, args.max_restarts, args.backoff_s)


def cmd_sweep(args) -> int:
    from agentrl.sweep.command import main as sweep

    startup_gc.settle()  # light, and as long-running as its trials
    return sweep(args)


def cmd_layout(args) -> int:
    from agentrl.config import load_config
    from agentrl.layout import simulated_ranks_per_node
    from agentrl.run.plan import JobShape, config_plan, format_plan, parse_hosts

    config = load_config(args.config, args.overrides)
    hosts = parse_hosts(args.hosts) if args.hosts else None
    ranks_per_node = args.ranks_per_node or simulated_ranks_per_node()
    job = JobShape(args.np, ranks_per_node, args.gpus_per_node, hosts=hosts)
    # the transport is resolved from the planned placements, as a run resolves it
    print(format_plan(config_plan(config, job), single_process=args.np == 1, evaluating=args.eval))
    if args.np == 1:
        print("world size 1: every role runs in this one process")
    return 0


def cmd_envs(args) -> int:
    from agentrl.env.registry import registered_ids

    for env_id in registered_ids():
        print(env_id)
    return 0


def cmd_algorithms(args) -> int:
    from agentrl.algorithms.registry import describe

    rows = describe()
    width = max(len(name) for name, _ in rows)
    for name, summary in rows:
        print(f"{name:<{width}}  {summary}")
    return 0


def cmd_check_env(args) -> int:
    import yaml

    from agentrl.env.check import inspect_env, time_random_episodes

    kwargs = yaml.safe_load(args.kwargs) or {}
    rows = None
    if args.data:
        from agentrl.data.loading import load_rows

        loaded = load_rows(args.data, "--data")
        rows = [loaded[i] for i in range(min(len(loaded), 16))]
    report = inspect_env(args.env_id, kwargs, rows=rows)
    problems = report.problems
    for problem in problems:
        print(f"FAIL {problem}")
    for warning in report.warnings:
        print(f"WARN {warning}")
    if not problems:
        steps, seconds = time_random_episodes(args.env_id, kwargs, rows=rows)
        print(f"5 random episodes: {steps} steps in {seconds * 1e3:.1f} ms ({seconds / steps * 1e3:.3f} ms/step)")
    print(f"{args.env_id}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def cmd_config_doc(args) -> int:
    from pathlib import Path

    from agentrl.commands.config_doc import config_reference

    if not args.write:
        print(config_reference())
        return 0
    start, end = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
    path = Path(args.write)
    text = path.read_text() if path.is_file() else ""
    if start not in text or end not in text.split(start, 1)[1]:
        raise UserError(f"{path} has no {start} ... {end} block to replace")
    before, rest = text.split(start, 1)
    after = rest.split(end, 1)[1]
    path.write_text(f"{before}{start}\n{config_reference().strip()}\n{end}{after}")
    print(f"wrote the config reference into {path}")
    return 0


COMMANDS = {
    "train": cmd_train,
    "eval": cmd_eval,
    "serve": cmd_serve,
    "export-merged": cmd_export_merged,
    "sft": cmd_sft,
    "episodes-to-sft": cmd_episodes_to_sft,
    "supervise": cmd_supervise,
    "sweep": cmd_sweep,
    "layout": cmd_layout,
    "envs": cmd_envs,
    "algorithms": cmd_algorithms,
    "check-env": cmd_check_env,
    "config-doc": cmd_config_doc,
}


def entry_point() -> None:
    """The `agentrl` command: `main`, then MPI ended where its errors are still reported."""
    startup_gc.defer_collection()
    try:
        code = main()
    except BrokenPipeError:  # the reader went away (`agentrl sweep status DIR | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so exit's flush of stdout fails no more
        code = 141  # what a shell reports for a command ended by SIGPIPE
    from agentrl.transport import finalize

    finalize()
    sys.exit(code)


if __name__ == "__main__":
    entry_point()
