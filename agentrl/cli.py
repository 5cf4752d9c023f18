"""The `agentrl` command: the parser and the table of subcommands, each a module of agentrl/commands/ with
`add_arguments(parser)` and `main(args) -> exit code`; only the chosen one is imported."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from agentrl.errors import EXIT_USER_ERROR, UserError
from agentrl.run import startup_gc

COMMANDS = {  # subcommand: (its module in agentrl/commands/, what `agentrl --help` says of it)
    "train": ("train", "train (run under mpirun/srun, or alone for single-process mode)"),
    "sft": ("sft", "supervised fine-tuning on chat transcripts (mpirun for several ranks, or alone)"),
    "episodes-to-sft": ("episodes_to_sft", "turn dumped RL episodes into SFT transcripts (successful ones by default)"),
    "eval": ("eval", "evaluate a checkpoint or model folder on the eval split (mpirun for several ranks, or alone)"),
    "serve": ("serve", None),  # its options: `serve_parser` below
    "export-merged": (
        "export_merged",
        "write a LoRA checkpoint (adapter folder) merged into its base as a plain Hugging Face model folder",
    ),
    "supervise": ("supervise", "run a training launch and relaunch it with resume=true when it crashes"),
    "sweep": ("sweep", "hyperparameter sweep: trials as run folders, Optuna grid/random/TPE, pruning, local or SLURM"),
    "layout": ("layout", "print which rank does what, without training"),
    "envs": ("envs", "list registered environment ids"),
    "algorithms": ("algorithms", "list registered RL algorithms (algorithm.name) with what each is"),
    "check-env": ("check_env", "validate an environment"),
    "check-model": ("check_model", "a model folder's chat format: family, template, markers, append-only, parse-back"),
    "config-doc": ("config_doc", "print the config reference as markdown"),
}


def seconds_or_null(text: str) -> float | None:
    """An argparse type: positive seconds, or `null` for none (argparse names the function in its error)."""
    if text == "null":
        return None
    seconds = float(text)
    if seconds <= 0:
        raise ValueError(text)
    return seconds


def command_module(name: str):
    return importlib.import_module(f"agentrl.commands.{COMMANDS[name][0]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="agentrl", description=f"The `agentrl` command: {' | '.join(COMMANDS)}.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, summary) in COMMANDS.items():
        if name == "serve":
            serve_parser(sub)
            continue
        p = sub.add_parser(name, help=summary)
        if name == chosen:
            command_module(name).add_arguments(p)
    args, extra = parser.parse_known_args(argv)  # key=value overrides may also follow options such as --np
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return command_module(args.command).main(args)
    except UserError as error:  # raised alike on every rank of a job: rank 0 says it once
        from agentrl.transport import world_rank

        if world_rank() == 0:
            print(f"agentrl: {error}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR


def serve_parser(sub) -> None:
    """`agentrl serve`'s options (its body: agentrl/commands/serve.py)."""
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
        "--api-key",
        default=os.environ.get("AGENTRL_API_KEY") or None,
        help="clients must send 'Authorization: Bearer KEY' (the openai client's api_key) on every route but /health; "
        "default: the AGENTRL_API_KEY environment variable (better than this option: a command line is visible to "
        "every user of the machine); neither: no key",
    )
    p.add_argument(
        "--list-tools",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="put a request's `tools` in the prompt (default); --no-list-tools for a model that learnt the call "
        "format in training (as the gateway's agent.list_tools: false): replies are parsed for tool calls either way",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help="the largest request body read (default 4 MiB); a larger one gets 413 before it is read",
    )
    p.add_argument(
        "--chat-format",
        help="the model's chat format family (the config's chat.format): hermes, qwen3, llama3, mistral, harmony, "
        "deepseek_v3, deepseek_r1, glm45, a registered one or module:Class; default: detected from the model folder",
    )
    p.add_argument(
        "--peer-timeout-s",
        type=seconds_or_null,
        default=60.0,
        help="over several nodes: stop the job when a node is silent this long (a cut link); null: never",
    )


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
