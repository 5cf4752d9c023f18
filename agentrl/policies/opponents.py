"""Self-play opponents: the draw of each game's opponent from `game.opponents`, the pool of frozen snapshots of the
learner (taken every `game.pool.every` versions, kept on disk under run_dir/policies/NAME/pool so a resume finds
them), and fixed programs loaded by `module:function`."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from agentrl.errors import UserError

POOL_FILE = "step_{:06d}.pt"


def game_rng(seed: int, step: int, game: int, purpose: int) -> np.random.Generator:
    """A generator for one game's draws, the same after a resume (from the run's seed, the step and the game)."""
    return np.random.default_rng(np.random.SeedSequence([seed, step, game, purpose]))


def draw_opponent(opponents: list, rng: np.random.Generator):
    """One of `opponents` (OpponentConfig), each as likely as its weight."""
    weights = np.array([opponent.weight for opponent in opponents], dtype=np.float64)
    return opponents[int(rng.choice(len(opponents), p=weights / weights.sum()))]


def pool_weights(versions: list[int], sampling: str, decay: float) -> np.ndarray:
    """The chance of each snapshot (oldest first): uniform, or (recent) each one `decay` times the next newer one's."""
    if not versions:
        return np.zeros(0)
    if sampling == "uniform":
        weights = np.ones(len(versions))
    else:
        weights = decay ** np.arange(len(versions) - 1, -1, -1, dtype=np.float64)
    return weights / weights.sum()


def load_program(path: str) -> Callable:
    """The function `module:function` names; UserError naming the field when it cannot be found."""
    module_name, _, name = path.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise UserError(
            f"game opponent program {path!r} cannot be loaded ({error}); name a function as module:function "
            "(e.g. envs.nim:random_move)"
        ) from None
    if not callable(function):
        raise UserError(f"game opponent program {path!r} is not a function; name one as module:function")
    return function


class OpponentPool:
    """Frozen snapshots of one policy's weights by version, the newest `size` kept; `folder` (None: memory only)
    holds each as a file, written by the one rank that `saves`."""

    def __init__(self, size: int, every: int, sampling: str, decay: float, folder: Path | None, saves: bool):
        self.size, self.every, self.sampling, self.decay = size, every, sampling, decay
        self.folder, self.saves = folder, saves
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def due(self, version: int) -> bool:
        return version % self.every == 0 and version not in self.snapshots

    def take(self, version: int, named_tensors) -> None:
        """Keep a copy of these weights as the snapshot of `version` (and write it, on the saving rank)."""
        weights = {name: tensor.detach().clone() for name, tensor in named_tensors}
        self.snapshots[version] = weights
        if self.saves and self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            final = self.folder / POOL_FILE.format(version)
            temporary = final.with_name(final.name + ".tmp")
            torch.save(weights, temporary)
            os.replace(temporary, final)
        for old in sorted(self.snapshots)[: -self.size]:
            del self.snapshots[old]

    def restore(self, start: int) -> list[int]:
        """A resume at step `start`: the newest `size` snapshots of versions before `start` from the folder (the
        version of `start` itself arrives with the run's first weights); their versions. UserError when one that the
        pool needs is missing."""
        if self.folder is None or not self.folder.is_dir():
            found = []
        else:
            names = (path.stem.removeprefix("step_") for path in self.folder.glob("step_*.pt"))
            found = sorted(int(name) for name in names if name.isdigit())
        wanted = [version for version in found if version < start][-self.size :]
        expected = list(range(0, start, self.every))[-self.size :]
        missing = sorted(set(expected) - set(wanted))
        if missing:
            raise UserError(
                f"resume at step {start}: the opponent pool's snapshot(s) {missing} are missing from {self.folder}; "
                "restore them, or start a new run_dir"
            )
        for version in wanted:
            self.snapshots[version] = torch.load(self.folder / POOL_FILE.format(version), weights_only=True)
        return wanted

    def draw(self, rng: np.random.Generator) -> int:
        """A snapshot's version by the sampling rule."""
        versions = sorted(self.snapshots)
        return versions[int(rng.choice(len(versions), p=pool_weights(versions, self.sampling, self.decay)))]
