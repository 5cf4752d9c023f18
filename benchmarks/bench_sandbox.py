"""Hostile snippets on each sandbox backend, and the cost of a sandboxed `print(1)`.

    python benchmarks/bench_sandbox.py [--runs 20]

Runs every case of tests/unit/test_code_sandbox.py's HOSTILE_CASES on each available
backend, checks containment with the same `problems` function as the tests, and prints a
markdown table. Then prints the median wall time of `print(1)` per backend against a plain
`subprocess.run([python, "-I", "-c", "print(1)"])`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.env.code_sandbox import (
    _base_interpreter,
    _rlimit_interpreter,
    available_backends,
    run_python,
    uncontained,
)
from tests.unit.test_code_sandbox import HOSTILE_CASES, HOSTILE_LIMITS, Host, problems, why_not_applicable

OBSERVATION_CHARS = 60


def hostile_table(backends: list[str]) -> list[str]:
    header = f"| snippet | backend | contained | what the model sees (last line, {OBSERVATION_CHARS} chars) | seconds |"
    rows = [header, "|---|---|---|---|---|"]
    for case in HOSTILE_CASES:
        for backend in backends:
            reason = why_not_applicable(case, backend)
            if reason is not None:
                rows.append(f"| {case.name} | {backend} | n/a: {reason} | | |")
                continue
            with tempfile.TemporaryDirectory() as folder:
                host = Host(Path(folder))
                os.environ["AGENTRL_TEST_SECRET"] = host.secret
                try:
                    result = run_python(case.code.format(**host.fields()), HOSTILE_LIMITS, backend=backend)
                    found = problems(case, result, host, HOSTILE_LIMITS)
                finally:
                    host.close()
            contained = "yes" if not found else "NO: " + "; ".join(found)
            # The last line says what happened; the first is often just "Traceback (most recent call last):".
            seen = result.as_observation().rstrip().rsplit("\n", 1)[-1][:OBSERVATION_CHARS].replace("|", "\\|")
            rows.append(f"| {case.name} | {backend} | {contained} | `{seen}` | {result.seconds:.2f} |")
    return rows


def median_seconds(run, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def overhead_table(backends: list[str], runs: int) -> list[str]:
    """Each backend against a plain run of the same interpreter (rlimit may use another one as root)."""
    rows = [f"| `print(1)`, median of {runs} | interpreter | plain seconds | sandboxed seconds | overhead |"]
    rows.append("|---|---|---|---|---|")
    for backend in backends:
        python = str(_base_interpreter() if backend == "bwrap" else _rlimit_interpreter())
        plain = median_seconds(
            lambda python=python: subprocess.run([python, "-I", "-c", "print(1)"], capture_output=True, check=True),
            runs,
        )
        sandboxed = median_seconds(lambda backend=backend: run_python("print(1)", backend=backend), runs)
        rows.append(f"| {backend} | {python} | {plain:.3f} | {sandboxed:.3f} | +{sandboxed - plain:.3f} s |")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    backends = available_backends()
    if not backends:
        raise SystemExit("no sandbox backend works here; see docs/sandbox.md")
    print(f"backends: {', '.join(backends)}; running as uid {os.geteuid()}; limits: {HOSTILE_LIMITS}")
    for backend in backends:
        print(f"{backend} does not contain here: {'; '.join(uncontained(backend)) or 'nothing beyond docs/sandbox.md'}")
    print()
    print("\n".join(hostile_table(backends)))
    print()
    print("\n".join(overhead_table(backends, args.runs)))


if __name__ == "__main__":
    main()
