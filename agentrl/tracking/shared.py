"""What the tracking backends share: the run's name, the file of run ids a resumed run continues, samples as
markdown."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.errors import UserError

IDS_FILE = "tracking.json"  # in run_dir: the W&B and MLflow runs a resumed run continues


def samples_markdown(texts: list[str]) -> str:
    """Episodes as fenced blocks separated by rules: TensorBoard's text tab and MLflow's artifact."""
    return "\n\n---\n\n".join(f"```\n{text}\n```" for text in texts)


def run_name(logging, run_dir: str | Path) -> str:
    return logging.run_name or Path(run_dir).resolve().name


def read_ids(run_dir: str | Path) -> dict:
    path = Path(run_dir) / IDS_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as error:
        raise UserError(f"{path} is not valid JSON ({error}); delete it to start new W&B/MLflow runs") from None


def write_ids(run_dir: str | Path, backend: str, ids: dict) -> None:
    """Record `backend`'s run ids in run_dir/tracking.json (written whole, then renamed into place)."""
    path = Path(run_dir) / IDS_FILE
    saved = {**read_ids(run_dir), backend: ids}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(saved, indent=1) + "\n")
    tmp.replace(path)
