"""MLflow: one MLflow run per agentrl run, in the experiment `logging.group` (a sweep) or `logging.project`.

The store is `logging.mlflow.tracking_uri`, else MLFLOW_TRACKING_URI, else a local file store in run_dir/mlruns.
Scalars are metrics at step = training step; MLflow allows letters, digits and `_ - . / : space` in names, so
`@` becomes `_at_` and any other character `_` (`eval/pass@4` -> `eval/pass_at_4`). The resolved config is
logged twice: flattened into params (`optimizer.lr`) and whole as the artifact config.yaml. Text samples are
markdown artifacts, `samples/step_000010.md`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import yaml

from agentrl.errors import UserError
from agentrl.file_lock import file_lock
from agentrl.tracking.shared import read_ids, run_name, samples_markdown, write_ids

METRICS_PER_BATCH = 1000  # MLflow's limits on one log_batch call
PARAMS_PER_BATCH = 100
PARAM_VALUE_CHARS = 6000
NAME_CHARS = re.compile(r"[^\w\-./: ]")


def metric_name(name: str) -> str:
    """The MLflow name of a TensorBoard scalar: the same, with the characters MLflow refuses replaced."""
    return NAME_CHARS.sub("_", name.replace("@", "_at_"))


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"optimizer": {"lr": 1e-5}} -> {"optimizer.lr": "1e-05"}; lists and nulls as JSON."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{metric_name(str(key))}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[name] = text[:PARAM_VALUE_CHARS]
    return flat


def tracking_uri(logging, run_dir: str | Path) -> str:
    return (
        logging.mlflow.tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or (Path(run_dir).resolve() / "mlruns").as_uri()
    )


def client(uri: str):
    """An MlflowClient of the store at `uri`; a folder store (a `file:` URI or a path) is opened with MLflow 3's
    opt-in, MLFLOW_ALLOW_FILE_STORE=true, unless the environment says otherwise."""
    from mlflow.tracking import MlflowClient

    if urlparse(uri).scheme in ("", "file"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracking_uri=uri)


def _store_lock(uri: str):
    """A lock on a local file store; nothing for a tracking server, which keeps experiment names unique itself."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return contextlib.nullcontext()
    folder = Path(parsed.path if parsed.scheme == "file" else uri)
    folder.mkdir(parents=True, exist_ok=True)
    return file_lock(folder / ".agentrl-experiments.lock")


class MlflowTracker:
    def __init__(self, logging, run_dir: str | Path, start_step: int):
        from mlflow.exceptions import MlflowException

        self.uri = tracking_uri(logging, run_dir)
        saved = read_ids(run_dir).get("mlflow", {}) if start_step else {}
        try:
            self._open(logging, run_dir, saved if saved.get("tracking_uri") == self.uri else {})
        except MlflowException as error:
            raise UserError(
                f"logging.backends lists mlflow, but MLflow could not open a run in {self.uri}: {error.message}; "
                "check logging.mlflow.tracking_uri (or MLFLOW_TRACKING_URI)"
            ) from None
        self.resumed_params = bool(saved)
        write_ids(run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": self.uri, "experiment": self.experiment})

    def _open(self, logging, run_dir, saved: dict) -> None:
        from mlflow.entities import RunStatus

        self.client = client(self.uri)
        self.experiment = logging.group or logging.project
        if saved.get("run_id"):
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            return
        experiment_id = self._experiment_id(self.experiment)
        tags = {"agentrl.run.claim": str(Path(run_dir).resolve())}
        if logging.group:
            tags["agentrl.group"] = logging.group
        run = self.client.create_run(experiment_id, run_name=run_name(logging, run_dir), tags=tags)
        self.run_id = run.info.run_id

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        with _store_lock(self.uri):  # a file store lets two trials starting together make two of the same name
            found = self.client.get_experiment_by_name(name)
            if found is None:
                try:
                    return self.client.create_experiment(name)
                except MlflowException:  # a tracking server's: another trial of the sweep made it first
                    found = self.client.get_experiment_by_name(name)
                    if found is None:
                        raise
        if found.lifecycle_stage != "active":
            raise UserError(
                f"MLflow experiment {name!r} in {self.uri} was deleted; restore it (`mlflow experiments restore`) "
                "or log to another one with logging.group=... or logging.project=..."
            )
        return found.experiment_id

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_name(key), float(value), now, step) for key, value in scalars.items()]
        for start in range(0, len(metrics), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + METRICS_PER_BATCH], synchronous=True)

    def log_text(self, step: int, tag: str, texts: list[str]) -> None:
        self.client.log_text(self.run_id, samples_markdown(texts), f"{metric_name(tag)}/step_{step:06d}.md")

    def log_config(self, config: dict) -> None:
        """Params once (MLflow refuses to change one: a resumed run adds only new keys); config.yaml each start."""
        from mlflow.entities import Param

        params = flatten(config)
        if self.resumed_params:
            logged = self.client.get_run(self.run_id).data.params
            params = {key: value for key, value in params.items() if key not in logged}
        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start : start + PARAMS_PER_BATCH], synchronous=True)
        self.client.log_text(self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")

    def flush(self) -> None:
        """Each log call has reached the store when it returns."""

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")
