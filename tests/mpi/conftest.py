import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.mpi.helpers import (
    FORKSERVER_VARIABLE,
    TRANSPORT_COMPARISON,
    assert_ok,
    job_env,
    scalars,
    small_run,
    train,
)


@pytest.fixture(scope="session", autouse=True)
def forkserver(tmp_path_factory):
    """One preloaded parent per pytest worker for the ranks of `helpers.mpirun`'s jobs (tests/mpi/forkserver.py).
    Until its socket appears, and where it is off (AGENTRL_TEST_FORKSERVER=0), ranks start cold."""
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
def mpi_sync_reference(tmp_path_factory, tiny_model_dir) -> dict:
    """TensorBoard scalars of TRANSPORT_COMPARISON with weights.transport=mpi, run once for every comparison."""
    run = tmp_path_factory.mktemp("mpi_reference")
    assert_ok(train(3, small_run(run, tiny_model_dir, **TRANSPORT_COMPARISON, **{"weights.transport": "mpi"})))
    return scalars(run / "run")
