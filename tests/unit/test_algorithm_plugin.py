"""A third-party algorithm, pip-installed from its own package and found by entry point, trains 2 steps.

Installed with `pip install --target` into a temporary folder (never the venv); every command
runs in a subprocess with that folder on PYTHONPATH, as a user's shell would.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mpi.helpers import scalars

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "sign_algorithm"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    root = tmp_path_factory.mktemp("algorithm_plugin")
    source, site = root / "source", root / "site"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target"]
    subprocess.run([*pip, str(site), str(source)], check=True, capture_output=True, timeout=120)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "OMP_NUM_THREADS": "1"}


def agentrl(environment, *arguments, timeout=120):
    command = [sys.executable, "-m", "agentrl.cli", *arguments]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_the_entry_point_is_listed(environment):
    result = agentrl(environment, "algorithms")
    assert result.returncode == 0, result.stderr
    assert "sign  " in result.stdout and "a test plug-in" in result.stdout


def test_options_of_the_plugin_are_validated(environment):
    for name in ("sign", "sign_algorithm:SignAdvantage"):
        good = agentrl(environment, "layout", "launch/configs/quickstart.yaml", "--np", "4", f"algorithm.name={name}")
        assert good.returncode == 0, good.stderr
    bad = agentrl(
        environment,
        "layout",
        "launch/configs/quickstart.yaml",
        "--np",
        "4",
        "algorithm.name=sign",
        "algorithm.scale=-1",
    )
    assert bad.returncode == 2 and "algorithm.scale: Input should be greater than 0" in bad.stderr


def test_the_plugin_trains_two_steps(environment, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        f"run_dir={run_dir}",
        "steps=2",
        f"model.path={tiny_model_dir}",
        "algorithm.name=sign",
        "algorithm.scale=0.5",
        "rollout.tasks_per_step=4",
        "rollout.group_size=4",
        "logging.progress=false",
    ]
    result = agentrl(environment, "train", "launch/configs/quickstart.yaml", *overrides, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(run_dir)
    assert [step for step, _ in logged["train/loss"]] == [0, 1]
    assert all(0.0 < value <= 0.5 + 1e-6 for _, value in logged["train/adv_abs_mean"])  # |A| is 0 or scale
    assert "name: sign\n  clip_eps_low: 0.2" in (run_dir / "config.yaml").read_text()
    assert "scale: 0.5" in (run_dir / "config.yaml").read_text()
