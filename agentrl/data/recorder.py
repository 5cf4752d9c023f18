"""What the trainer leader keeps of each step besides the batch: every rollout rank's data position, saved in
each checkpoint as `data_state.json`, and (rollout.dump_episodes) the step's episode dump."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.data.episode_dump import write_step

DATA_STATE_FILE = "data_state.json"
DATA_STATE_FORMAT = 1


class StepRecorder:
    """Fed by the trainer leader's `collect` each step; passed to checkpoint.save as extra state."""

    def __init__(self, run_dir: str | Path, dump: bool):
        self.run_dir, self.dump = Path(run_dir), dump
        self.positions: list[dict | None] = []

    def record(self, step: int, positions: list[dict | None], episodes: list[dict]) -> None:
        """`positions`: each rollout rank's (in rank order) after `step`; `episodes`: their dump records."""
        self.positions = positions
        if self.dump:
            write_step(self.run_dir, step, episodes)

    def save(self, folder: Path | None) -> None:
        """checkpoint.save's extra-state hook: the leader gets the step folder (other ranks None)."""
        if folder is None or not self.positions or any(p is None for p in self.positions):
            return
        state = {
            "format": DATA_STATE_FORMAT,
            "rows": self.positions[0]["rows"],
            "consumed": [p["consumed"] for p in self.positions],
        }
        (Path(folder) / DATA_STATE_FILE).write_text(json.dumps(state))

    def load(self, folder: Path) -> None:
        """Nothing: rollout ranks get their positions from rank 0 (train.py data_start)."""


def read_data_state(checkpoint_folder: Path) -> dict | None:
    path = Path(checkpoint_folder) / DATA_STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None
