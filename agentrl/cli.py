"""The `agentrl` command: train | layout | envs | algorithms | check-env | config-doc."""

from __future__ import annotations

import argparse
import sys

from agentrl.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train (run under mpirun/srun, or alone for single-process mode)")
    p.add_argument("config", help="YAML config, e.g. launch/configs/quickstart.yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. rollout.group_size=8 steps=50")

    p = sub.add_parser("layout", help="print which rank does what, without training")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--np", type=int, required=True, help="world size (ranks in the job)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node (default: all on one node)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (0: CPU)")

    sub.add_parser("envs", help="list registered environment ids")
    sub.add_parser("algorithms", help="list registered RL algorithms (algorithm.name) with what each is")

    p = sub.add_parser("check-env", help="validate an environment")
    p.add_argument("env_id")
    p.add_argument("--kwargs", default="{}", help="constructor kwargs as YAML/JSON, e.g. '{high: 20}'")

    sub.add_parser("config-doc", help="print the config reference as markdown")

    args, extra = parser.parse_known_args(argv)  # key=value overrides may also follow options such as --np
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return COMMANDS[args.command](args)
    except ConfigError as error:
        print(f"agentrl: {error}", file=sys.stderr)
        return 2


def cmd_train(args) -> int:
    from agentrl.config import load_config
    from agentrl.transport import abort_on_exception

    config = load_config(args.config, args.overrides)

    def run():
        from agentrl import preempt

        preempt.install()  # before the slow imports: a stop signal from now on is a graceful stop
        from agentrl.train import train

        done = train(config)
        return 0 if done == config.steps else preempt.EXIT_STOPPED

    try:
        return abort_on_exception(run)()
    except ConfigError:
        raise
    except Exception:
        return 1


def cmd_layout(args) -> int:
    from agentrl.config import load_config
    from agentrl.layout import engine_gpus, format_plan, plan

    config = load_config(args.config, args.overrides)
    rows = plan(config.layout, args.np, args.ranks_per_node, args.gpus_per_node, engine_gpus(config))
    print(format_plan(rows, single_process=args.np == 1))
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
    report = inspect_env(args.env_id, kwargs)
    problems = report.problems
    for problem in problems:
        print(f"FAIL {problem}")
    for warning in report.warnings:
        print(f"WARN {warning}")
    if not problems:
        steps, seconds = time_random_episodes(args.env_id, kwargs)
        print(f"5 random episodes: {steps} steps in {seconds * 1e3:.1f} ms ({seconds / steps * 1e3:.3f} ms/step)")
    print(f"{args.env_id}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


def cmd_config_doc(args) -> int:
    from agentrl.config import config_reference

    print(config_reference())
    return 0


COMMANDS = {
    "train": cmd_train,
    "layout": cmd_layout,
    "envs": cmd_envs,
    "algorithms": cmd_algorithms,
    "check-env": cmd_check_env,
    "config-doc": cmd_config_doc,
}

if __name__ == "__main__":
    sys.exit(main())
