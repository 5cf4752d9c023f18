"""Weights & Biases: one W&B run per agentrl run, in `logging.project`, grouped by `logging.group` (a sweep).

Offline (`logging.wandb.mode=offline` or WANDB_MODE=offline) it writes run_dir/wandb/offline-run-*/, which
`wandb sync` uploads later. Scalars are logged at W&B step = training step, the text samples as a table with one
row per episode, the resolved config as the run's config.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from agentrl.errors import UserError
from agentrl.tracking.shared import read_ids, run_name, write_ids

SAMPLE_COLUMNS = ["episode", "text"]
_NOT_STARTED = (
    "logging.backends lists wandb, but W&B did not start: {why}. Log in first (`wandb login`, or set "
    "WANDB_API_KEY), or write an offline run folder to upload later with `wandb sync`: logging.wandb.mode=offline "
    "(or WANDB_MODE=offline)"
)


def _online(mode: str | None) -> bool:
    """Whether W&B would run online: `logging.wandb.mode`, else WANDB_MODE, else online."""
    return (mode or os.environ.get("WANDB_MODE") or "online") == "online"


def _logged_in() -> bool:
    """A W&B API key where `wandb login` puts it (the netrc entry of WANDB_BASE_URL's host) or in WANDB_API_KEY;
    checked before W&B's own client starts, which without one can wait on its service instead of failing."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker:
    def __init__(self, logging, run_dir: str | Path, start_step: int):
        import wandb

        self.wandb = wandb
        if _online(logging.wandb.mode) and not _logged_in():
            raise UserError(_NOT_STARTED.format(why="no W&B login was found"))
        saved = read_ids(run_dir).get("wandb", {}) if start_step else {}
        run_id = saved.get("id")
        try:
            self.run = wandb.init(
                project=logging.project,
                entity=logging.wandb.entity,
                group=logging.group,
                name=run_name(logging, run_dir),
                dir=str(run_dir),
                mode=logging.wandb.mode,  # None: wandb reads WANDB_MODE, else online
                id=run_id,
                resume="allow" if run_id else None,
                settings=wandb.Settings(console="off"),  # the job's own output keeps the console
            )
        except wandb.errors.Error as error:
            raise UserError(_NOT_STARTED.format(why=str(error).rstrip("."))) from None
        write_ids(run_dir, "wandb", {"id": self.run.id, "project": logging.project, "group": logging.group})
        # Resumed online, W&B keeps what it has and refuses steps below its last: the redone steps keep their
        # first values (TensorBoard shows the redone ones).
        self.first_step = (self.run.starting_step or 0) if run_id else 0

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        if step >= self.first_step:
            self.run.log(dict(scalars), step=step)

    def log_text(self, step: int, tag: str, texts: list[str]) -> None:
        if step >= self.first_step:
            table = self.wandb.Table(columns=SAMPLE_COLUMNS, data=[[i, text] for i, text in enumerate(texts)])
            self.run.log({tag: table}, step=step)

    def log_config(self, config: dict) -> None:
        self.run.config.update(config, allow_val_change=True)  # a resumed run may have raised `steps`

    def flush(self) -> None:
        """W&B's own service writes (offline) or uploads (online) what was logged as it comes."""

    def close(self) -> None:
        self.run.finish()
