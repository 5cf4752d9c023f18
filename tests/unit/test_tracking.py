"""W&B and MLflow beside TensorBoard (agentrl/tracking/): driven through RunLogger, then read back from the offline
W&B run folder and the MLflow file store and checked against TensorBoard's own event files."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from agentrl.config import LoggingConfig
from agentrl.errors import UserError
from agentrl.tracking import check_installed, open_trackers, read_ids
from agentrl.tracking.mlflow_run import client as mlflow_client
from agentrl.tracking.mlflow_run import flatten, metric_name
from agentrl.tracking.run_logger import RunLogger
from tests.conftest import ROOT
from tests.mpi.helpers import scalars as tensorboard_scalars
from tests.tracking_files import WandbRun, mlflow_scalars, same, wandb_run_folder

pytest.importorskip("wandb", reason="the wandb extra: pip install 'agentrl[wandb]'")
pytest.importorskip("mlflow", reason="the mlflow extra: pip install 'agentrl[mlflow]'")

CONFIG = {"seed": 3, "optimizer": {"lr": 1e-5, "betas": [0.9, 0.99]}, "env": {"id": "guess_number", "kwargs": {}}}
TEXTS = ["user: guess\nassistant: 4", "user: guess\nassistant: <tool_call>{}</tool_call>"]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")


def both(**fields) -> LoggingConfig:
    return LoggingConfig(backends=["wandb", "mlflow"], **fields)


def test_backends_always_hold_tensorboard_first_and_refuse_unknown_or_repeated_names():
    assert LoggingConfig().backends == ["tensorboard"]
    assert LoggingConfig(backends=["wandb"]).backends == ["tensorboard", "wandb"]
    assert LoggingConfig(backends="mlflow").backends == ["tensorboard", "mlflow"]
    assert LoggingConfig(backends=["mlflow", "tensorboard"]).backends == ["tensorboard", "mlflow"]
    with pytest.raises(ValueError, match="lists a backend twice"):
        LoggingConfig(backends=["wandb", "wandb"])
    with pytest.raises(ValueError, match="'tensorboard', 'wandb' or 'mlflow'"):
        LoggingConfig(backends=["neptune"])


def test_mlflow_names_keep_tensorboard_names_where_mlflow_allows_them():
    assert metric_name("episode/success_rate") == "episode/success_rate"
    assert metric_name("eval/pass@4") == "eval/pass_at_4"
    assert metric_name("env/reward[0]") == "env/reward_0_"
    flat = flatten({"a": {"b": 1, "c": [1, 2], "d": None, "e": {}}, "f": "x" * 7000})
    assert flat == {"a.b": "1", "a.c": "[1, 2]", "a.d": "null", "a.e": "{}", "f": "x" * 6000}


def test_a_missing_extra_is_refused_naming_the_fix(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    check_installed(["tensorboard", "mlflow"])
    with pytest.raises(UserError, match=r"lists wandb, which is not installed; pip install 'agentrl\[wandb\]'"):
        check_installed(["tensorboard", "wandb", "mlflow"])


def test_train_refuses_a_missing_extra_before_it_writes_anything(tmp_path, tiny_model_dir):
    """`agentrl train` with wandb listed, in a Python where `import wandb` finds nothing: one message, no run."""
    hide = (
        "import sys, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'wandb': raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import importlib.util\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'wandb' else real(n, *a)\n"
        "from agentrl.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    run_dir = tmp_path / "run"
    args = ["train", str(ROOT / "launch/configs/quickstart.yaml"), f"run_dir={run_dir}", f"model.path={tiny_model_dir}"]
    args.append("logging.backends=[tensorboard,wandb]")
    command = [sys.executable, "-c", hide, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    assert "pip install 'agentrl[wandb]'" in result.stdout + result.stderr
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "tb").exists()


def test_every_backend_gets_the_same_scalars_config_and_samples(tmp_path, offline):
    logging = both(group="lr-sweep", run_name="trial-7")
    trackers = open_trackers(logging, tmp_path, 0, CONFIG)
    logger = RunLogger(str(tmp_path), total_steps=4, start_step=0, progress=False, restarts=1, trackers=trackers)
    for step in range(4):
        if step % 2 == 0:  # evaluation comes first at its step, as in train_loop
            logger.log_scalars(step, {"eval/success": 0.25 * step, "eval/pass@4": 0.5})
        tokens = float("nan") if step == 2 else 100.0 + step
        logger.log(step, {"episode/success_rate": step / 4, "loss/policy": -0.1 * step, "perf/tokens_per_s": tokens})
        if step == 3:
            logger.samples(step, TEXTS)
    logger.close()

    board = tensorboard_scalars(tmp_path)
    assert set(board) == {
        "eval/success", "eval/pass@4", "episode/success_rate", "loss/policy", "perf/tokens_per_s", "run/restarts"
    }  # fmt: skip
    assert board["eval/success"] == [(0, 0.0), (2, 0.5)] and board["run/restarts"] == [(s, 1.0) for s in range(4)]

    wandb_run = WandbRun(wandb_run_folder(tmp_path))
    written = wandb_run.scalars()
    assert set(written) == set(board)
    for name, points in board.items():
        assert same(written[name], points), (name, written[name], points)
    assert (wandb_run.run.project, wandb_run.run.run_group, wandb_run.run.display_name) == (
        "agentrl", "lr-sweep", "trial-7"
    )  # fmt: skip
    assert {key: value for key, value in wandb_run.config.items() if key != "_wandb"} == CONFIG
    assert wandb_run.table(3, "samples") == {"columns": ["episode", "text"], "data": [[0, TEXTS[0]], [1, TEXTS[1]]]}

    ids = read_ids(tmp_path)
    assert ids["wandb"]["id"] == wandb_run.run.run_id
    uri, run_id = ids["mlflow"]["tracking_uri"], ids["mlflow"]["run_id"]
    assert uri == (tmp_path / "mlruns").as_uri()
    stored = mlflow_scalars(uri, run_id)
    assert set(stored) == {metric_name(name) for name in board}
    for name, points in board.items():
        assert same(stored[metric_name(name)], points), (name, stored[metric_name(name)], points)

    client = mlflow_client(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "trial-7"
    assert client.get_experiment(run.info.experiment_id).name == "lr-sweep"
    assert run.data.params == flatten(CONFIG)
    artifacts = tmp_path / "mlruns" / run.info.experiment_id / run_id / "artifacts"
    assert yaml.safe_load((artifacts / "config.yaml").read_text()) == CONFIG
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    (text,) = events.Tensors("samples/text_summary")
    assert (artifacts / "samples" / "step_000003.md").read_text() == text.tensor_proto.string_val[0].decode()
    assert text.step == 3


def test_a_resumed_run_continues_the_same_runs_and_keeps_its_first_params(tmp_path, offline):
    first = open_trackers(both(), tmp_path, 0, CONFIG)
    logger = RunLogger(str(tmp_path), 4, 0, progress=False, trackers=first)
    for step in range(3):  # a checkpoint at step 2, then a crash after step 2's scalars
        logger.log(step, {"episode/success_rate": 0.1 * step})
    logger.close()
    ids = read_ids(tmp_path)
    time.sleep(1.1)  # W&B names an offline run's folder by the second it started; a real resume takes longer
    changed = {**CONFIG, "seed": 4, "steps": 8}  # a resumed run may raise steps; MLflow refuses to change a param
    second = open_trackers(both(), tmp_path, 2, changed)
    logger = RunLogger(str(tmp_path), 4, 2, progress=False, trackers=second)
    logger.log(2, {"episode/success_rate": 0.5})
    logger.close()
    assert read_ids(tmp_path) == ids

    run = mlflow_client(ids["mlflow"]["tracking_uri"]).get_run(ids["mlflow"]["run_id"])
    assert run.data.params["seed"] == "3" and run.data.params["steps"] == "8"
    assert run.info.status == "FINISHED"
    offline_runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{ids['wandb']['id']}"))
    assert len(offline_runs) == 2  # offline, W&B writes a second folder with the same run id
    assert same(WandbRun(offline_runs[0]).scalars()["episode/success_rate"], [(0, 0.0), (1, 0.1), (2, 0.2)])
    assert WandbRun(offline_runs[1]).scalars()["episode/success_rate"] == [(2, 0.5)]
    metrics = mlflow_scalars(ids["mlflow"]["tracking_uri"], ids["mlflow"]["run_id"])
    assert same(metrics["episode/success_rate"], [(0, 0.0), (1, 0.1), (2, 0.2), (2, 0.5)])  # MLflow keeps both


def test_runs_of_one_group_share_one_mlflow_experiment(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = (tmp_path / "mlruns").as_uri()
    logging = LoggingConfig(backends=["mlflow"], group="sweep-a", mlflow={"tracking_uri": store})
    for trial in range(2):
        run_dir = tmp_path / f"{trial:04d}"
        run_dir.mkdir()
        (tracker,) = open_trackers(logging, run_dir, 0, CONFIG)
        tracker.log_scalars(0, {"episode/success_rate": float(trial)})
        tracker.close()
    client = mlflow_client(store)
    experiment = client.get_experiment_by_name("sweep-a")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == ["0000", "0001"]
    assert sorted(run.data.metrics["episode/success_rate"] for run in runs) == [0.0, 1.0]


def test_wandb_online_without_a_login_says_how_to_log_in_or_go_offline(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    online = LoggingConfig(backends=["wandb"], wandb={"mode": "online"})  # W&B reads WANDB_MODE once a process
    with pytest.raises(UserError, match=r"wandb login.*logging\.wandb\.mode=offline"):
        open_trackers(online, tmp_path, 0, CONFIG)
