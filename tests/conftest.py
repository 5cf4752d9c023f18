import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

GUESS_TEXTS = [
    f"Guess the number between 1 and 10. You have 4 guesses. {n} higher lower correct invalid, answer with a number"
    for n in range(1, 11)
]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 model and tokenizer, built once per session and loaded with from_pretrained."""
    from agentrl.models.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny"
    build_tiny_model(path, GUESS_TEXTS, hidden_size=32, num_layers=2, num_heads=4, vocab_size=96)
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
