"""What a test job's ranks cost started cold against forked from the preloaded test parent (tests/mpi/forkserver.py).

    python benchmarks/bench_forked_ranks.py [--repeats 3]

Runs the same 3-step `mpirun -n 3 agentrl train` (trainer, rollout, env) on the tiny test model, alternately with
every rank started cold and with every rank forked, and prints the medians of its wall time and of the CPU time of
all its processes (the forks' CPU is read from the fork server's reaped children).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.models.tiny import TinyShape, build_tiny_model  # noqa: E402
from tests.conftest import GUESS_TEXTS  # noqa: E402
from tests.mpi import helpers  # noqa: E402


def reaped_cpu(pid: int) -> float:
    """CPU seconds of the reaped children of `pid` (its forks): cutime + cstime from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def one_job(folder: Path, model: Path, server: subprocess.Popen) -> tuple[float, float]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    forks = reaped_cpu(server.pid)
    start = time.perf_counter()
    result = helpers.train(3, helpers.small_run(folder, model, **{"layout.env": 1}))
    wall = time.perf_counter() - start
    helpers.assert_ok(result)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime + reaped_cpu(server.pid) - forks
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model = scratch / "tiny"
        build_tiny_model(model, GUESS_TEXTS, TinyShape(hidden_size=32, num_layers=2, num_heads=4, vocab_size=96))
        socket = scratch / "socket"
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.mpi.forkserver", str(socket)], cwd=ROOT, env=helpers.job_env()
        )
        while not socket.exists():
            time.sleep(0.1)
        timings = {"cold": [], "forked": []}
        try:
            for repeat in range(args.repeats):
                for mode, variable in (("cold", "0"), ("forked", str(socket))):
                    os.environ[helpers.FORKSERVER_VARIABLE] = variable
                    timings[mode].append(one_job(scratch / f"{mode}{repeat}", model, server))
        finally:
            server.terminate()
            server.wait()
    print(f"`mpirun -n 3 agentrl train`, 3 steps, tiny model; medians of {args.repeats}\n")
    print("| ranks | wall s | CPU s (all processes) |")
    print("|---|---:|---:|")
    for mode, runs in timings.items():
        print(f"| {mode} | {statistics.median(w for w, _ in runs):.1f} | {statistics.median(c for _, c in runs):.1f} |")


if __name__ == "__main__":
    main()
