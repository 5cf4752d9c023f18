"""Real local sweeps of tiny training runs: 4 trials 2 at a time, pruning with the graceful stop, and a sweep killed
midway then resumed with no trial lost or run twice."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("optuna")
pytest.importorskip("matplotlib")

from tests.conftest import ROOT
from tests.mpi.helpers import FORKED, rank_command, scalars


@pytest.fixture(autouse=True)
def _trials_forked_from_a_preloaded_parent(forkserver):
    """The trials' `agentrl train` starts as the mpirun tests' ranks do (`rank_command`)."""


AGENTRL = str(Path(sys.executable).parent / "agentrl")


def write_spec(tmp_path: Path, model_dir: Path, **changes) -> Path:
    data = {
        "base": str(ROOT / "launch" / "configs" / "quickstart.yaml"),
        "sweep_dir": str(tmp_path / "sweep"),
        "overrides": {
            "model.path": str(model_dir),
            "steps": 2,
            "rollout.tasks_per_step": 2,
            "rollout.group_size": 2,
            "eval": {"every": 2, "seeds": [1000000, 4]},
            "checkpoint.every": 0,
        },
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}, "rollout.temperature": {"choice": [0.8, 1.0]}},
        "method": "random",
        "trials": 4,
        "concurrency": 2,
    }
    if rank_command() == FORKED:  # each trial a fork of the preloaded parent (tests/mpi/forkserver.py)
        data["agentrl_command"] = [*rank_command(), "-m", "agentrl.cli"]
    data.update(changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def sweep(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    result = subprocess.run([AGENTRL, "sweep", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return result


def results(sweep_dir: Path) -> list[dict]:
    with open(sweep_dir / "results.csv") as handle:
        return list(csv.DictReader(handle))


def test_local_sweep_runs_every_trial_as_a_run_folder_with_its_values(tmp_path, tiny_model_dir):
    spec = write_spec(tmp_path, tiny_model_dir)
    result = sweep(str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = tmp_path / "sweep"
    rows = results(sweep_dir)
    assert [row["trial"] for row in rows] == ["0", "1", "2", "3"]
    assert all(row["state"] == "complete" and row["objective"] != "" and row["steps"] == "2" for row in rows)
    for row in rows:
        run_dir = sweep_dir / "trials" / f"{int(row['trial']):04d}"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())  # what agentrl train resolved and ran
        assert config["optimizer"]["lr"] == pytest.approx(float(row["optimizer.lr"]))
        assert config["rollout"]["temperature"] == float(row["rollout.temperature"])
        assert config["run_dir"] == str(run_dir) and config["runtime"]["torch_threads"] >= 1
        assert float(row["objective"]) == scalars(run_dir)["eval/success"][-1][1]
    assert len({row["optimizer.lr"] for row in rows}) == 4
    assert (sweep_dir / "results.png").stat().st_size > 10_000
    assert "4/4 done, 0 running, 0 pruned; best eval/success" in result.stdout
    assert "2 running" in result.stdout  # two at a time
    status = sweep("status", str(sweep_dir))
    assert status.returncode == 0 and "trial  seed  optimizer.lr  rollout.temperature  eval/success" in status.stdout


def test_a_hopeless_trial_is_pruned_with_the_graceful_stop(tmp_path, tiny_model_dir):
    """Minimize turns per eval episode: 1 guess allowed takes 1 turn, 3 guesses take more; the second trial is
    worse than the first at its first evaluation and is stopped there with a checkpoint."""
    spec = write_spec(
        tmp_path,
        tiny_model_dir,
        space={"env.kwargs.max_guesses": {"choice": [1, 3]}},
        objective={"scalar": "eval/turns_mean", "direction": "minimize"},
        pruner={"name": "median", "startup_trials": 1},
        trials=2,
        concurrency=1,
    )
    data = yaml.safe_load(spec.read_text())
    # time for the stop to land mid-run: the sweep looks at a trial's evaluations once a second
    data["overrides"].update({"steps": 80, "checkpoint.every": 0})
    spec.write_text(yaml.safe_dump(data))
    from agentrl.sweep.spec import load_spec
    from agentrl.sweep.study import Sweep

    prepared = Sweep(load_spec(spec))
    prepared.create_or_check(resume=False)
    study = prepared.study()
    study.enqueue_trial({"env.kwargs.max_guesses": 1})
    study.enqueue_trial({"env.kwargs.max_guesses": 3})
    result = sweep(str(spec), "--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = results(tmp_path / "sweep")
    assert [(row["env.kwargs.max_guesses"], row["state"]) for row in rows] == [("1", "complete"), ("3", "pruned")]
    assert rows[0]["steps"] == "80" and int(rows[1]["steps"]) < 80
    pruned_dir = tmp_path / "sweep" / "trials" / "0001"
    assert (pruned_dir / "checkpoints").is_dir()  # the graceful stop checkpointed
    assert "exit_code" in (tmp_path / "sweep" / "runners" / "0001.json").read_text()
    assert '"exit_code": 75' in (tmp_path / "sweep" / "runners" / "0001.json").read_text()


def test_a_killed_sweep_resumes_without_losing_or_repeating_a_trial(tmp_path, tiny_model_dir):
    spec = write_spec(tmp_path, tiny_model_dir, trials=3)
    data = yaml.safe_load(spec.read_text())
    data["overrides"].update({"steps": 8, "checkpoint.every": 2})
    spec.write_text(yaml.safe_dump(data))
    sweep_dir = tmp_path / "sweep"
    process = subprocess.Popen(
        [AGENTRL, "sweep", str(spec)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 120
    while not list(sweep_dir.glob("trials/*/checkpoints/step_*")):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read().decode()
        time.sleep(0.5)
    os.kill(process.pid, signal.SIGKILL)  # no goodbye: its trials get SIGTERM from the kernel and checkpoint
    process.wait()
    result = sweep(str(spec), "--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resumes (start 2)" in result.stdout
    rows = results(sweep_dir)
    assert [row["trial"] for row in rows] == ["0", "1", "2"]
    assert all(row["state"] == "complete" and row["steps"] == "8" for row in rows)
    for row in rows:
        run_dir = sweep_dir / "trials" / f"{int(row['trial']):04d}"
        assert sorted(step for step, _ in scalars(run_dir)["episode/count"]) == list(range(8))  # each step once
    resumed = [yaml.safe_load((sweep_dir / "runners" / f"{int(r['trial']):04d}.json").read_text()) for r in rows]
    assert any(record["attempt"] == 2 for record in resumed)


def test_a_trial_stopped_before_it_could_checkpoint_is_stopped_not_failed(tmp_path, tiny_model_dir):
    """A sweep stopped while a trial is still starting (here a trial that only sleeps, as one importing torch does)
    sends it SIGTERM before agentrl's handler is in place: it dies of the signal, and is resumable, not failed."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    spec = write_spec(tmp_path, tiny_model_dir, trials=2, agentrl_command=sleeper)
    sweep_dir = tmp_path / "sweep"
    process = subprocess.Popen([AGENTRL, "sweep", str(spec)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(sweep_dir.glob("runners/*.json"))) < 2 or not all(
        "training_pid" in path.read_text() for path in sweep_dir.glob("runners/*.json")
    ):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 75, output
    assert "trial 0 stopped" in output and "trial 1 stopped" in output and "failed" not in output
    assert [row["state"] for row in results(sweep_dir)] == ["stopped", "stopped"]


def test_a_sweeps_trials_are_one_wandb_group_and_one_mlflow_experiment(tmp_path, tiny_model_dir, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from agentrl.tracking.mlflow_run import client
    from tests.tracking_files import WandbRun, same, wandb_run_folder

    monkeypatch.setenv("WANDB_MODE", "offline")  # the trials inherit the sweep's environment
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = write_spec(tmp_path, tiny_model_dir, trials=2)
    data = yaml.safe_load(spec.read_text())
    data["overrides"]["logging.backends"] = ["wandb", "mlflow"]
    spec.write_text(yaml.safe_dump(data))
    result = sweep(str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = tmp_path / "sweep"
    mlflow = client((sweep_dir / "mlruns").as_uri())  # both trials, started together, in one experiment
    experiment = mlflow.get_experiment_by_name("sweep")
    runs = {run.info.run_name: run for run in mlflow.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["sweep-0000", "sweep-0001"]
    for number in range(2):
        run_dir = sweep_dir / "trials" / f"{number:04d}"
        run = runs[f"sweep-{number:04d}"]
        assert run.data.tags["agentrl.run.claim"] == str(run_dir)
        history = [(m.step, m.value) for m in mlflow.get_metric_history(run.info.run_id, "eval/success")]
        assert same(history, scalars(run_dir)["eval/success"])
        wandb_run = WandbRun(wandb_run_folder(run_dir))
        assert (wandb_run.run.run_group, wandb_run.run.display_name) == ("sweep", f"sweep-{number:04d}")
        assert same(wandb_run.scalars()["eval/success"], scalars(run_dir)["eval/success"])


def test_a_learning_table_sweep_over_two_bases_fills_the_table(tmp_path, tiny_model_dir):
    """bases: two configs as one more dimension, each trial with its base's ranks (1: train alone, 2: mpirun -n 2);
    then tools/learning_table.py writes each (base, algorithm) cell from the trials' TensorBoard files."""
    quickstart = str(ROOT / "launch" / "configs" / "quickstart.yaml")
    spec = write_spec(
        tmp_path,
        tiny_model_dir,
        base=None,
        bases={
            "seven": {"config": quickstart, "ranks": 1},
            "five": {
                "config": quickstart,
                "ranks": 2,
                "overrides": {"env.kwargs.high": 5, "layout": {"trainer": 1, "rollout": 1, "env": 0}},
            },
        },
        space={"algorithm.name": {"choice": ["grpo", "rloo"]}},
        method="grid",
        trials=None,
        objective={"scalar": "rollout/success_rate", "reduce": "mean_last"},
    )
    data = yaml.safe_load(spec.read_text())
    del data["base"]
    data["overrides"].update({"steps": 4, "eval.every": 0})
    spec.write_text(yaml.safe_dump(data))
    result = sweep(str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = tmp_path / "sweep"
    rows = results(sweep_dir)
    assert sorted((row["base"], row["algorithm.name"]) for row in rows) == [
        ("five", "grpo"), ("five", "rloo"), ("seven", "grpo"), ("seven", "rloo")
    ]  # fmt: skip
    for row in rows:
        log = (sweep_dir / "logs" / f"{int(row['trial']):04d}.log").read_text()
        assert ("mpirun -n 2" in log) == (row["base"] == "five")
        config = yaml.safe_load((Path(row["run_dir"]) / "config.yaml").read_text())
        assert config["env"]["kwargs"]["high"] == (5 if row["base"] == "five" else 7)
    page = tmp_path / "table.md"
    page.write_text("before\n<!-- learning-table:start full -->\nold\n<!-- learning-table:end -->\nafter\n")
    table = subprocess.run(
        [sys.executable, "tools/learning_table.py", str(sweep_dir), "--write", str(page)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert table.returncode == 0, table.stdout + table.stderr
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    for row in rows:
        success = [value for _, value in scalars(Path(row["run_dir"]))["rollout/success_rate"]]
        end = success[-1]  # the last 10% of 4 steps is the last step
        cell = f"| {row['base']} | {row['algorithm.name']} | 0 | {success[0]:.2f} -> {end:.2f} | {end:.2f} |"
        assert cell in text, text
