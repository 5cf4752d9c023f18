"""The example plugin (examples/wordle_env) as a user gets it: pip-installed, then found by entry point.

The package is installed with `pip install --target` into a temporary folder, never into
the venv, and every command runs in a subprocess with that folder on PYTHONPATH.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordle_env"
BUILD_LEFTOVERS = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(site folder, source copy, environment for subprocesses) with agentrl-example-wordle installed."""
    root = tmp_path_factory.mktemp("example_plugin")
    source, site = root / "wordle_env", root / "site"
    shutil.copytree(EXAMPLE, source, ignore=BUILD_LEFTOVERS)  # setuptools builds in the source tree
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target"]
    subprocess.run([*pip, str(site), str(source)], check=True, capture_output=True, timeout=120)
    environment = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    return site, source, environment


def agentrl(environment, *arguments, cwd, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *arguments],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_install_ships_the_package_its_word_list_and_the_entry_point(installed):
    site, _, _ = installed
    assert (site / "agentrl_wordle" / "words.txt").is_file()
    entry_points = next(site.glob("agentrl_example_wordle-*.dist-info")) / "entry_points.txt"
    assert "wordle = agentrl_wordle:WordleEnv" in entry_points.read_text()


def test_agentrl_envs_lists_the_plugin_id(installed, tmp_path):
    _, _, environment = installed
    listed = agentrl(environment, "envs", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "wordle" in listed.stdout.split()


def test_check_env_passes_on_the_installed_copy(installed, tmp_path):
    site, _, environment = installed
    code = "import agentrl_wordle; print(agentrl_wordle.__file__)"
    where = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)  # not a copy installed elsewhere
    checked = agentrl(environment, "check-env", "wordle", "--kwargs", "{max_guesses: 3}", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "wordle: ok" in checked.stdout


def test_two_training_steps_of_the_example_config_write_tensorboard_events(installed, tmp_path):
    _, source, environment = installed
    run_dir = tmp_path / "run"
    overrides = [
        f"run_dir={run_dir}",
        f"model.path={tmp_path / 'model'}",
        "steps=2",
        "rollout.tasks_per_step=2",
        "rollout.group_size=4",
        "checkpoint.every=0",
        "logging.progress=false",
    ]
    trained = agentrl(environment, "train", str(source / "config.yaml"), *overrides, cwd=tmp_path, timeout=120)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-4000:]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    episodes = [event.value for event in events.Scalars("episode/count")]
    assert episodes == [8.0, 8.0]  # 2 tasks x 4 episodes per step, both steps logged
    assert "id: wordle" in (run_dir / "config.yaml").read_text()


def test_the_example_package_own_tests_pass_against_the_installed_copy(installed, tmp_path):
    _, source, environment = installed
    tests = shutil.copytree(source / "tests", tmp_path / "tests")  # away from the source, so the install is used
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
