"""`agentrl check-env ENV_ID [--kwargs YAML] [--data ROWS]`: validate an environment (agentrl/env/check.py) and time
a few random episodes."""

from __future__ import annotations

import yaml

from agentrl.env.check import inspect_env, time_random_episodes


def add_arguments(parser) -> None:
    parser.add_argument("env_id")
    parser.add_argument("--kwargs", default="{}", help="constructor kwargs as YAML/JSON, e.g. '{high: 20}'")
    parser.add_argument(
        "--data", help="rows to reset with (as data.train takes: jsonl, parquet, ...), e.g. for the qa env"
    )


def main(args) -> int:
    kwargs = yaml.safe_load(args.kwargs) or {}
    if args.env_id.startswith("verifiers:"):  # an agent program through the gateway, not a TextEnv
        from agentrl.env.adapters.verifiers import check_taskset

        problems, summary = check_taskset(args.env_id, kwargs)
        for problem in problems:
            print(f"FAIL {problem}")
        print(f"{args.env_id}: {summary if not problems else f'{len(problems)} problem(s)'}")
        return 1 if problems else 0
    rows = None
    if args.data:
        from agentrl.data.loading import load_rows  # imports datasets: only when rows are given

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
