"""Checkpoints: a Hugging Face model folder plus optimizer, scheduler, RNG and step.

Written to `step_NNNNNN.tmp` and renamed, so a crash mid-write never leaves a checkpoint
that looks complete. A model sharded with FSDP2 is gathered into a full state dict first
(a collective: every trainer rank calls `save`, only the leader writes), so the folder is
a normal Hugging Face model folder either way. Its optimizer state is saved unsharded and
keyed by parameter name, so a resume may use any number of trainer ranks.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from agentrl.trainer import parallel

STEP_DIR = re.compile(r"^step_(\d{6,})$")
STATE_FILE = "trainer_state.pt"
FULL_OPTIMIZER = "full_by_name"  # optimizer state from parallel.full_optimizer_state


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_path(run_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:06d}"


def latest(run_dir: str | Path) -> tuple[int, Path] | None:
    """(step, path) of the newest complete checkpoint, or None."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return max(found) if found else None


def save(run_dir, step: int, model, tokenizer, optimizer, scheduler, keep: int, leader: bool = True) -> Path | None:
    """Every trainer rank calls this (sharded models gather collectively); the leader writes and returns the path."""
    model_state, optimizer_format = None, "local"
    if parallel.is_sharded(model):
        model_state = parallel.full_model_state(model)
        optimizer_state = parallel.full_optimizer_state(model, optimizer)
        optimizer_format = FULL_OPTIMIZER
    elif leader:
        optimizer_state = optimizer.state_dict()
    if not leader:
        return None
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = step_path(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    state = {
        "step": step,
        "optimizer": optimizer_state,
        "optimizer_format": optimizer_format,
        "scheduler": scheduler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
    }
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(root, keep)
    return final


def load_state(path: Path, optimizer, scheduler, model=None) -> int:
    """Every trainer rank: optimizer, scheduler and RNG back from `path`; `model` is needed for name-keyed state."""
    state = torch.load(Path(path) / STATE_FILE, weights_only=False)
    full = state.get("optimizer_format") == FULL_OPTIMIZER
    if full and model is None:
        raise ValueError(f"{path} holds name-keyed optimizer state: pass the model to load_state")
    if not full and model is not None and parallel.is_sharded(model):
        raise ValueError(
            f"{path} was saved without parallelism.fsdp (optimizer state of whole parameters, by position) and cannot "
            "be loaded into sharded parameters: resume it with parallelism.fsdp=false"
        )
    if full:
        parallel.load_full_optimizer_state(model, optimizer, state["optimizer"])
    else:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return int(state["step"])


def _prune(root: Path, keep: int) -> None:
    steps = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)))
    for _, path in steps[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
