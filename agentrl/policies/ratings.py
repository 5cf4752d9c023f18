"""Elo ratings of the learner, each of its snapshots and each program opponent, from the games they played against
it; kept by the learner's trainer leader and saved in its checkpoints (`ratings.json`)."""

from __future__ import annotations

import json
from pathlib import Path

RATINGS_FILE = "ratings.json"
START = 1000.0
LEARNER = "learner"


def snapshot_name(version: int) -> str:
    return f"step_{version:06d}"


class EloRatings:
    """Online Elo (K = `k`): each game moves both sides by k x (outcome - expected). A snapshot enters at the learner's
    rating when it is taken, so its number says how strong the learner was then."""

    def __init__(self, k: float = 16.0):
        self.k = k
        self.ratings: dict[str, float] = {LEARNER: START}

    def add_snapshot(self, version: int) -> None:
        self.ratings.setdefault(snapshot_name(version), self.ratings[LEARNER])

    def record(self, opponent: str, outcome: float) -> None:
        """One game of the learner against `opponent` (a snapshot's or a program's name); `outcome` is the learner's
        (1 win, 0.5 draw, 0 loss)."""
        mine = self.ratings[LEARNER]
        theirs = self.ratings.setdefault(opponent, START)
        expected = 1.0 / (1.0 + 10 ** ((theirs - mine) / 400.0))
        self.ratings[LEARNER] = mine + self.k * (outcome - expected)
        self.ratings[opponent] = theirs - self.k * (outcome - expected)

    def metrics(self) -> dict[str, float]:
        return {f"elo/{name}": rating for name, rating in self.ratings.items()}

    # a part of a checkpoint's extra state (agentrl/trainer/checkpoint.py calls save(folder) and load(folder))
    def save(self, step_folder: Path | None) -> None:
        if step_folder is not None:
            (Path(step_folder) / RATINGS_FILE).write_text(json.dumps(self.ratings, indent=1))

    def load(self, step_folder: Path) -> None:
        path = Path(step_folder) / RATINGS_FILE
        if path.is_file():
            self.ratings = {name: float(value) for name, value in json.loads(path.read_text()).items()}
