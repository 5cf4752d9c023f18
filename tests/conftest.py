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
