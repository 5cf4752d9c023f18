"""`agentrl sweep SPEC [--resume | --slurm]`, `agentrl sweep status DIR`, `agentrl sweep task SPEC` (one SLURM array
task): read the spec, check its space, then hand over to the backend."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agentrl.errors import UserError
from agentrl.run import startup_gc
from agentrl.sweep import require
from agentrl.sweep.spec import load_spec
from agentrl.sweep.study import SPEC_FILE, Sweep


def open_sweep(spec_path: str, resume: bool) -> Sweep:
    """Load and check the spec (every searched value through the config loader), then start or reopen its folder."""
    from agentrl.sweep.space import check_space

    require("optuna")
    spec = load_spec(spec_path)
    check_space(spec)
    sweep = Sweep(spec)
    sweep.create_or_check(resume)
    return sweep


def run(spec_path: str, resume: bool, slurm: bool, sbatch_args: list[str]) -> int:
    if slurm:
        from agentrl.sweep.slurm import sbatch_command

        sweep = open_sweep(spec_path, resume)
        command = sbatch_command(spec_path, sweep, sbatch_args)
        print(f"agentrl sweep: {' '.join(command)}", flush=True)
        return subprocess.run(command).returncode
    from agentrl.sweep.local import run_local
    from agentrl.sweep.status import report

    sweep = open_sweep(spec_path, resume)
    print(
        f"agentrl sweep: {sweep.dir}: {sweep.spec.method}, {sweep.spec.budget()} trials, "
        f"{sweep.spec.concurrency} at a time",
        flush=True,
    )
    code = run_local(sweep)
    print(report(sweep), flush=True)
    return code


def task(spec_path: str) -> int:
    """A SLURM array task: the first task to arrive starts the sweep folder, the others join it."""
    from agentrl.sweep.slurm import run_task

    require("optuna")
    spec = load_spec(spec_path)
    sweep = Sweep(spec)
    sweep.dir.mkdir(parents=True, exist_ok=True)
    with sweep.claim_lock():
        if not (sweep.dir / SPEC_FILE).is_file():
            from agentrl.sweep.space import check_space

            check_space(spec)
        sweep.create_or_check(resume=True)
    return run_task(sweep)


def add_arguments(parser) -> None:
    parser.description = "agentrl sweep SPEC [--resume] [--slurm] | agentrl sweep status SWEEP_DIR (docs/sweeps.md)"
    parser.add_argument("target", help="the sweep spec YAML (e.g. launch/sweeps/quickstart_lr.yaml), or `status`")
    parser.add_argument("path", nargs="?", help="with status: the sweep folder (the spec's sweep_dir)")
    parser.add_argument("--resume", action="store_true", help="continue the sweep in the spec's sweep_dir")
    parser.add_argument("--slurm", action="store_true", help="submit it as a SLURM job array (slurm/sweep.sh)")
    parser.add_argument("--sbatch", help="with --slurm: more sbatch options, e.g. '--time=02:00:00 --cpus-per-task=4'")


def main(args) -> int:
    """The `agentrl sweep` subcommand's arguments -> status, one SLURM task, or a sweep."""
    startup_gc.settle()  # light, and as long-running as its trials
    if args.target == "status":
        return status(_need(args.path, "agentrl sweep status SWEEP_DIR"))
    if args.target == "task":
        return task(_need(args.path, "agentrl sweep task SPEC (what slurm/sweep.sh runs)"))
    if args.path is not None:
        raise UserError(f"agentrl sweep {args.target} {args.path}: one spec only; usage: agentrl sweep SPEC [--resume]")
    return run(args.target, args.resume, args.slurm, args.sbatch.split() if args.sbatch else [])


def _need(path: str | None, usage: str) -> str:
    if path is None:
        raise UserError(f"missing argument; usage: {usage}")
    return path


def status(sweep_dir: str) -> int:
    from agentrl.sweep.spec import parse_spec
    from agentrl.sweep.status import report

    saved = Path(sweep_dir) / SPEC_FILE
    if not saved.is_file():
        raise UserError(f"{sweep_dir} is not a sweep folder (no {SPEC_FILE}); pass the sweep_dir of a spec")
    import yaml

    print(report(Sweep(parse_spec(yaml.safe_load(saved.read_text()), str(saved)))))
    return 0
