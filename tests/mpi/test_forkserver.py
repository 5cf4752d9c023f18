"""The preloaded parent that forks the mpirun tests' ranks (tests/mpi/forkserver.py): a forked rank must behave as
a freshly started one to mpirun and to the test: exit codes, deaths by signal, signals sent to it, kills."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import mpirun_command
from tests.mpi.helpers import FORKED_RANK, FORKSERVER_VARIABLE, job_env, mpirun, rank_command

REPORT = """
import os, sys
from mpi4py import MPI
world = MPI.COMM_WORLD
total = world.allreduce(world.rank)
print(f"rank {world.rank} of {world.size} total {total} parent {os.getppid()} cwd {os.getcwd()} "
      f"argv {sys.argv[1:]} marker <{os.environ.get('FORKSERVER_TEST_MARKER')}>", flush=True)
if world.rank == int(sys.argv[1]):
    sys.exit(int(sys.argv[2]))
"""

WAIT_FOR_TERM = """
import signal, sys, time
from mpi4py import MPI
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def server(forkserver):
    if forkserver is None:
        pytest.skip(f"{FORKSERVER_VARIABLE}=0: every rank starts cold")
    socket_path = Path(os.environ[FORKSERVER_VARIABLE])
    deadline = time.monotonic() + 120
    while not socket_path.exists():  # still preloading
        assert forkserver.poll() is None, "the fork server ended while preloading"
        assert time.monotonic() < deadline, "the fork server did not listen within 120 s"
        time.sleep(0.2)
    return forkserver


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_ranks_are_forks_with_the_clients_arguments_folder_environment_and_exit_code(tmp_path, server, monkeypatch):
    monkeypatch.setenv("FORKSERVER_TEST_MARKER", "seen")
    script = write(tmp_path, "report.py", REPORT)
    result = mpirun(3, [str(script), "1", "3"], timeout=60, cwd=tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    # mpirun may join two ranks' lines into one: read the reports, not the lines
    reports = sorted(
        re.findall(r"rank (\d) of (\d) total (\d) parent (\d+) cwd (\S+) argv (\[.*?\]) marker <(\w+)>", result.stdout)
    )
    expected = [(str(rank), "3", "3", str(server.pid), str(tmp_path), "['1', '3']", "seen") for rank in range(3)]
    assert reports == expected, result.stdout + result.stderr


def test_a_rank_killed_by_a_signal_is_reported_as_killed(tmp_path, server):
    script = write(tmp_path, "die.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    command = [*rank_command(), str(script)]
    result = subprocess.run(command, env=job_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr


def test_a_signal_to_the_rank_mpirun_started_reaches_the_fork(tmp_path, server):
    script = write(tmp_path, "term.py", WAIT_FOR_TERM)
    command = [*mpirun_command(1), *rank_command(), str(script)]
    job = subprocess.Popen(command, env=job_env(), stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert job.stdout.readline().strip() == "ready"
    client = next(pid for pid, cmdline in _processes() if f"{FORKED_RANK} {script}" in cmdline)
    os.kill(client, signal.SIGTERM)  # as a test or SLURM signals a rank it found by its command line
    assert job.wait(timeout=30) == 75


def test_killing_the_client_kills_its_fork(tmp_path, server):
    marker = tmp_path / "pid"
    script = write(
        tmp_path,
        "sleep.py",
        f"import os, pathlib, time\npathlib.Path({str(marker)!r}).write_text(str(os.getpid()))\ntime.sleep(60)\n",
    )
    client = subprocess.Popen([*rank_command(), str(script)], env=job_env())
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.05)
    fork = int(marker.read_text())
    assert _parent(fork) == server.pid
    client.kill()
    client.wait()
    deadline = time.monotonic() + 10
    while _alive(fork):
        assert time.monotonic() < deadline, "the fork outlived its killed client"
        time.sleep(0.05)


def test_without_a_server_the_rank_starts_cold(tmp_path):
    script = write(tmp_path, "cold.py", "import os, sys\nprint(os.getppid())\n")
    env = {**job_env(), FORKSERVER_VARIABLE: str(tmp_path / "no-such-socket")}
    client = subprocess.run([sys.executable, "-S", str(FORKED_RANK), str(script)], env=env, capture_output=True)
    assert client.returncode == 0, client.stderr
    assert int(client.stdout) == os.getpid()  # it exec'd itself into `python cold.py`: its parent is this test


def _processes():
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
