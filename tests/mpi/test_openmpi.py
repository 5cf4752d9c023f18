"""launch/mpirun.sh with Debian's Open MPI (apt openmpi-bin) running the venv's mpi4py: a 2-rank train."""

import os
import subprocess
from pathlib import Path

import pytest

from tests import apt
from tests.conftest import ROOT
from tests.mpi.helpers import assert_ok, scalars, small_run

pytestmark = pytest.mark.mpi

DEBIAN_MPIRUN = Path("/usr/bin/mpirun")


def is_open_mpi() -> bool:
    if not DEBIAN_MPIRUN.exists():
        return False
    result = subprocess.run([DEBIAN_MPIRUN, "--version"], capture_output=True, text=True, timeout=30)
    return "Open MPI" in result.stdout


def test_train_through_launch_script_with_debian_open_mpi(tmp_path, tiny_model_dir):
    why_not = apt.ensure(("openmpi-bin",), is_open_mpi)
    if why_not:
        pytest.skip(why_not)
    env = {**os.environ, "MPIRUN": str(DEBIAN_MPIRUN), "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("MPI4PY_LIBMPI", None)
    config = str(ROOT / "launch" / "configs" / "quickstart.yaml")
    command = ["bash", "launch/mpirun.sh", "2", config, *small_run(tmp_path, tiny_model_dir, steps=2)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert_ok(result)
    assert "world=2" in result.stdout  # one job of two ranks, not two singletons
    assert [s for s, _ in scalars(tmp_path / "run")["episode/count"]] == [0, 1]
