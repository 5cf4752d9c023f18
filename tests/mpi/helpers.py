"""Launching real mpirun jobs from pytest, with timeouts, and reading their TensorBoard files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, mpirun_command

SCRIPTS = Path(__file__).parent / "scripts"
RUN_SCRIPT = Path(__file__).parent / "run_script.py"  # starts a script as the agentrl command starts a rank
FORKED_RANK = Path(__file__).parent / "forked_rank.py"  # a rank forked from the preloaded test parent
FORKSERVER_VARIABLE = "AGENTRL_TEST_FORKSERVER"  # its socket (tests/conftest.py); "0": every rank starts cold


QUICKSTART = str(ROOT / "launch" / "configs" / "quickstart.yaml")
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")
# The run each weight transport trains, to compare with the MPI broadcast's (conftest.mpi_sync_reference).
TRANSPORT_COMPARISON = {"layout.rollout": 2, "layout.env": 0, "steps": 3, "weights.bucket_mb": 0.05}


def on_cpu_below_gpus(count: int, monkeypatch) -> None:
    """Run this test's jobs as on CPU where the machine has GPUs, but fewer than `count`: sharded trainers (FSDP over
    NCCL) need a GPU each, and a test comparing runs needs them all on one kind of device."""
    import shutil

    if shutil.which("nvidia-smi") is None:
        return
    import torch

    if 0 < torch.cuda.device_count() < count:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def job_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error"}


FORKED = [sys.executable, "-S", str(FORKED_RANK)]  # how a forked rank's client starts


def rank_command() -> list[str]:
    """How mpirun starts each rank of `mpirun()`'s jobs: forked from the preloaded parent where one runs
    (tests/mpi/forkserver.py), else a fresh interpreter."""
    return [*FORKED] if os.environ.get(FORKSERVER_VARIABLE, "0") != "0" else [sys.executable]


def agentrl_on_path(folder: Path) -> str:
    """A PATH whose `agentrl` starts as `rank_command()` does: for jobs that a launch script starts by name
    (`launch/mpirun.sh` runs `mpirun -n N agentrl train`)."""
    venv_bin = str(Path(sys.executable).parent)
    if rank_command() != FORKED:
        return f"{venv_bin}{os.pathsep}{os.environ['PATH']}"
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "agentrl"
    shim.write_text(f'#!/bin/sh\nexec {" ".join(rank_command())} -m agentrl.cli "$@"\n')
    shim.chmod(0o755)
    return f"{folder}{os.pathsep}{venv_bin}{os.pathsep}{os.environ['PATH']}"


def mpirun(n: int, args: list[str], timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = job_env()
    command = [*mpirun_command(n), *rank_command(), *args]
    try:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(
            f"mpirun -n {n} {' '.join(args)} hung past {timeout}s\nstdout:\n{error.stdout}\nstderr:\n{error.stderr}"
        ) from None


def train(n: int, overrides: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    return mpirun(n, ["-m", "agentrl.cli", "train", QUICKSTART, *overrides], timeout)


def start_training(n: int, overrides: list[str]) -> subprocess.Popen:
    """`mpirun -n N agentrl train` in the background, leading its own process group (a terminal's Ctrl-C target)."""
    command = [*mpirun_command(n), *rank_command(), "-m", "agentrl.cli", "train", QUICKSTART, *overrides]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen(command, cwd=ROOT, env=job_env(), start_new_session=True, **pipes)


def wait_for(
    condition, timeout_s: float, process: subprocess.Popen, what: str = "a checkpoint", poll_s: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            detail = f"exit {process.returncode}\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
            raise AssertionError(f"no {what} appeared in time; {detail}")
        time.sleep(poll_s)


def finish(process: subprocess.Popen, timeout_s: float, what: str) -> tuple[str, str]:
    """(stdout, stderr) once the job ends; kills it and fails if it takes longer than timeout_s."""
    try:
        return process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"{what} did not end within {timeout_s} s:\n{out[-3000:]}\n{err[-4000:]}") from None


def job_processes(run_dir: Path) -> dict[int, dict[str, str]]:
    """{pid: environment} of the live processes whose command line has run_dir=RUN_DIR (read from /proc; Linux)."""
    return processes_with(f"run_dir={run_dir}")


def processes_with(argument: str) -> dict[int, dict[str, str]]:
    """{pid: environment} of the live processes with `argument` among their command-line arguments."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argument.encode() in cmdline and state != "Z":
            is_client = cmdline[: len(FORKED)] == [os.fsencode(part) for part in FORKED]
            pid = fork_of(int(entry.name)) if is_client else int(entry.name)
            found[pid] = dict(item.decode(errors="replace").partition("=")[::2] for item in environ)
    return found


def fork_of(client: int) -> int:
    """The pid of the rank that a forked_rank.py client started in the fork server (tests/mpi/forkserver.py):
    the process a test means when it signals the rank. Waits a little for a fork still starting; a client that
    ended meanwhile (or never reached the server) is its own answer."""
    record = Path(f"{os.environ.get(FORKSERVER_VARIABLE, '')}.forks") / str(client)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            return int(record.read_text())
        except (OSError, ValueError):
            if not Path(f"/proc/{client}").exists():
                break
            time.sleep(0.01)
    return client


def job_pids(run_dir: Path) -> list[int]:
    """The launcher's and every rank's pid."""
    return list(job_processes(run_dir))


def rank_pids(run_dir: Path) -> dict[int, int]:
    """{world rank: pid} of the live ranks of the job training in run_dir."""
    return ranks_with(f"run_dir={run_dir}")


def ranks_with(argument: str) -> dict[int, int]:
    """{world rank: pid} of the live ranks with `argument` among their command-line arguments."""
    found = {}
    for pid, variables in processes_with(argument).items():
        rank = next((variables[name] for name in RANK_VARIABLES if name in variables), None)
        if rank is not None:
            found[int(rank)] = pid
    return found


def script(n: int, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return mpirun(n, [str(RUN_SCRIPT), str(SCRIPTS / name), *args], timeout)


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar as TensorBoard shows it: all event files of run_dir/tb in order, a resumed run's purges applied."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def small_run(tmp_path: Path, model_dir: Path, **extra) -> list[str]:
    """Overrides for a seconds-long run on the tiny test model."""
    settings = {
        "run_dir": tmp_path / "run",
        "model.path": model_dir,
        "steps": 3,
        "rollout.tasks_per_step": 4,
        "rollout.group_size": 4,
        "checkpoint.every": 0,
        "logging.progress": "false",
        "layout.trainer": 1,
        "layout.rollout": 1,
        "layout.env": 0,
        "trainer.shared_prefix": "false",  # whole rows: the runs here go under FSDP and against whole-row references
        **extra,
    }
    return [f"{key}={value}" for key, value in settings.items()]


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-6000:]}"
    )
