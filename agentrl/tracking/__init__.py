"""Where the trainer leader's scalars, resolved config and text samples go: TensorBoard always, W&B and MLflow
when `logging.backends` lists them (docs/tracking.md).

Every backend is a `Tracker`: `log_scalars(step, scalars)`, `log_text(step, tag, texts)`, `log_config(config)`,
`flush()`, `close()`. `run_logger.RunLogger` fans out to them with the same scalar names (and draws the console
progress bar). W&B and MLflow are optional extras: `check_installed` refuses a run that lists one that is missing
before any work starts.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Protocol

from agentrl.errors import UserError
from agentrl.tracking.shared import read_ids

EXTRAS = {"wandb": ("wandb", "pip install 'agentrl[wandb]'"), "mlflow": ("mlflow", "pip install 'agentrl[mlflow]'")}


class Tracker(Protocol):
    def log_scalars(self, step: int, scalars: dict[str, float]) -> None: ...

    def log_text(self, step: int, tag: str, texts: list[str]) -> None: ...

    def log_config(self, config: dict) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def check_installed(backends: list[str]) -> None:
    """A UserError naming the extra to install, for each listed backend whose package is missing."""
    missing = [name for name in backends if name in EXTRAS and importlib.util.find_spec(EXTRAS[name][0]) is None]
    if missing:
        fixes = "; ".join(f"{EXTRAS[name][1]}" for name in missing)
        raise UserError(
            f"logging.backends lists {', '.join(missing)}, which is not installed; {fixes} (or remove it from "
            "logging.backends)"
        )


def summary_lines(run_dir: str | Path, backends: list[str]) -> list[str]:
    """The end-of-run summary's lines for W&B and MLflow: where this run went, and how to upload an offline one."""
    ids, lines = read_ids(run_dir), []
    if "wandb" in backends and "wandb" in ids:
        run_id = ids["wandb"]["id"]
        offline = sorted((Path(run_dir) / "wandb").glob(f"offline-run-*-{run_id}"))
        if offline:  # `--id` uploads a resumed run's folders, oldest first, into one W&B run
            lines.append(f"  wandb         wandb sync --id {run_id} {' '.join(str(path) for path in offline)}")
        else:
            lines.append(f"  wandb         run {run_id} in project {ids['wandb']['project']}")
    if "mlflow" in backends and "mlflow" in ids:
        mlflow = ids["mlflow"]
        lines.append(f"  mlflow        run {mlflow['run_id']} of {mlflow['experiment']!r} in {mlflow['tracking_uri']}")
    return lines


def open_trackers(logging, run_dir: str | Path, start_step: int, config: dict) -> list[Tracker]:
    """The backends `logging.backends` lists besides TensorBoard, started, each with `config` logged.

    A run that starts at step 0 opens new W&B/MLflow runs; a resumed one (start_step > 0) continues the runs
    recorded in run_dir/tracking.json.
    """
    trackers: list[Tracker] = []
    try:
        for name in logging.backends:
            if name == "wandb":
                from agentrl.tracking.wandb_run import WandbTracker

                trackers.append(WandbTracker(logging, run_dir, start_step))
            elif name == "mlflow":
                from agentrl.tracking.mlflow_run import MlflowTracker

                trackers.append(MlflowTracker(logging, run_dir, start_step))
        for tracker in trackers:
            tracker.log_config(config)
    except BaseException:
        for tracker in trackers:
            tracker.close()
        raise
    return trackers
