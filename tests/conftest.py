import os
import shutil
import sys
from pathlib import Path

import pytest

from agentrl.run import startup_gc

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

GUESS_TEXTS = [
    f"Guess the number between 1 and 10. You have 4 guesses. {n} higher lower correct invalid, answer with a number"
    for n in range(1, 11)
]


@pytest.fixture(scope="session")
def forkserver(tmp_path_factory):
    """One preloaded parent per pytest worker for the ranks of `helpers.rank_command()` (tests/mpi/forkserver.py).
    Until its socket appears, and where it is off (AGENTRL_TEST_FORKSERVER=0), ranks start cold."""
    import subprocess

    from tests.mpi.helpers import FORKSERVER_VARIABLE, job_env

    if os.environ.get(FORKSERVER_VARIABLE) == "0":
        yield None
        return
    folder = tmp_path_factory.mktemp("forkserver")
    log = folder / "log"
    with open(log, "w") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.mpi.forkserver", str(folder / "socket")],
            cwd=ROOT,
            env=job_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    os.environ[FORKSERVER_VARIABLE] = str(folder / "socket")
    yield server
    del os.environ[FORKSERVER_VARIABLE]
    crashed = server.poll()
    server.terminate()
    server.wait(timeout=30)
    assert crashed is None, f"the test fork server ended early (exit {crashed}):\n{log.read_text()[-4000:]}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 model and tokenizer, built once per session and loaded with from_pretrained."""
    from agentrl.models.tiny import TinyShape, build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny"
    build_tiny_model(path, GUESS_TEXTS, TinyShape(hidden_size=32, num_layers=2, num_heads=4, vocab_size=96))
    return path


def mpirun_command(n: int) -> list[str]:
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found: pip install mpich (or apt-get install openmpi-bin)")
    command = [mpirun, "-n", str(n)]
    if "Open MPI" in _mpirun_version(mpirun):
        command += ["--oversubscribe", "--allow-run-as-root"]
    return command


def _mpirun_version(mpirun: str) -> str:
    import subprocess

    try:
        return subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def pytest_configure(config):
    startup_gc.defer_collection()  # as every rank does: the suite imports torch, transformers and every test module


def pytest_collection_finish(session):
    startup_gc.settle()  # the collected tests and what they imported are set aside from later collections


def pytest_runtest_logreport(report):
    """With $AGENTRL_FAILURE_LOG set, each failure's report is appended to that file as it happens, so a run cut
    short by a time limit (benchmarks/gpu_verify.sh) still says why its tests failed. Written by the process that
    prints the summary: the only one, or xdist's controller."""
    path = os.environ.get("AGENTRL_FAILURE_LOG")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a") as log:
        log.write(f"==== {report.nodeid} ({report.when}) ====\n{report.longreprtext}\n")
        for title, text in report.sections:
            log.write(f"---- {title} ----\n{text[-6000:]}\n")


# launch/test.sh runs the suite on two xdist workers. Tests that share a machine-wide test bed run on one of them:
# the SLURM daemons, and the network-namespace nodes, whose bridge and namespace names are fixed. So do the tests of
# a module whose module-scoped fixture runs jobs (each worker would run it again), and those compared with the
# session's MPI reference run.
SERIAL_FOLDERS = {"slurm": "clusters", "multinode": "clusters"}


def _test_folder(item) -> str:
    return item.path.relative_to(ROOT / "tests").parts[0]


def _serial_group(item) -> str | None:
    test_bed = SERIAL_FOLDERS.get(_test_folder(item))
    if test_bed is not None:
        return test_bed
    fixtures = getattr(item, "_fixtureinfo", None)
    definitions = fixtures.name2fixturedefs if fixtures is not None else {}
    if "mpi_sync_reference" in definitions:
        return "mpi_sync_reference"
    if any(defs and defs[-1].scope == "module" for defs in definitions.values()):
        return item.module.__name__
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _serial_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # The test beds first: their minutes of mostly waiting then overlap the mpirun tests on the other worker,
    # instead of running alone at the end.
    items.sort(key=lambda item: _test_folder(item) not in SERIAL_FOLDERS)
