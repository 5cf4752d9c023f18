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
    "serve": ("serve", "serve a model or a run's checkpoint over an OpenAI-compatible API (mpirun: several engines)"),
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


def command_module(name: str):
    return importlib.import_module(f"agentrl.commands.{COMMANDS[name][0]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="agentrl", description=f"The `agentrl` command: {' | '.join(COMMANDS)}.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, summary) in COMMANDS.items():
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
