"""A real run on 2 ranks (trainer, rollout) with W&B offline and MLflow beside TensorBoard: what the trainer leader
wrote to each is read back and checked against TensorBoard's scalars and the run's config.yaml."""

from __future__ import annotations

import os

import pytest
import yaml

from tests.mpi.helpers import assert_ok, scalars, small_run, train
from tests.tracking_files import WandbRun, mlflow_scalars, same, wandb_run_folder

pytestmark = pytest.mark.mpi


def test_a_training_run_logs_the_same_scalars_config_and_samples_to_wandb_and_mlflow(
    tmp_path, tiny_model_dir, monkeypatch
):
    pytest.importorskip("wandb", reason="the wandb extra: pip install 'agentrl[wandb]'")
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install 'agentrl[mlflow]'")
    from agentrl.tracking.mlflow_run import metric_name

    monkeypatch.setenv("WANDB_MODE", "offline")  # the job inherits the test's environment
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    settings = {
        "steps": 2,
        "eval.every": 1,
        "eval.seeds": "[100,4]",
        "eval.n": 2,
        "eval.temperature": 1.0,
        "logging.sample_every": 1,
        "logging.backends": "[wandb,mlflow]",
        "logging.group": "tracking-test",
    }
    result = train(2, small_run(tmp_path, tiny_model_dir, **settings), timeout=180)
    assert_ok(result)
    run_dir = tmp_path / "run"
    board = scalars(run_dir)
    assert {"episode/success_rate", "train/loss", "run/restarts", "eval/pass@2"} <= set(board)
    assert [step for step, _ in board["episode/success_rate"]] == [0, 1]
    assert [step for step, _ in board["eval/pass@2"]] == [1, 2]
    saved_config = yaml.safe_load((run_dir / "config.yaml").read_text())

    wandb_run = WandbRun(wandb_run_folder(run_dir))
    written = wandb_run.scalars()
    assert set(written) == set(board)
    for name, points in board.items():
        assert same(written[name], points), (name, written[name], points)
    assert wandb_run.run.run_group == "tracking-test" and wandb_run.run.display_name == "run"
    assert {key: value for key, value in wandb_run.config.items() if key != "_wandb"} == saved_config
    samples = [step for step, row in wandb_run.rows.items() if "samples" in row]
    assert samples == [0, 1]
    assert all(text for _, text in wandb_run.table(1, "samples")["data"])

    ids = yaml.safe_load((run_dir / "tracking.json").read_text())
    uri, run_id = ids["mlflow"]["tracking_uri"], ids["mlflow"]["run_id"]
    assert uri == (run_dir / "mlruns").resolve().as_uri() and ids["mlflow"]["experiment"] == "tracking-test"
    stored = mlflow_scalars(uri, run_id)
    assert set(stored) == {metric_name(name) for name in board}
    for name, points in board.items():
        assert same(stored[metric_name(name)], points), (name, stored[metric_name(name)], points)
    (experiment,) = [p for p in (run_dir / "mlruns").iterdir() if (p / run_id).is_dir()]
    artifacts = experiment / run_id / "artifacts"
    assert yaml.safe_load((artifacts / "config.yaml").read_text()) == saved_config
    assert sorted(os.listdir(artifacts / "samples")) == ["step_000000.md", "step_000001.md"]
    folder = wandb_run_folder(run_dir)
    assert f"wandb sync --id {wandb_run.run.run_id} {folder}" in result.stdout  # the run summary: how to upload
    assert f"mlflow        run {run_id} of 'tracking-test' in {uri}" in result.stdout
