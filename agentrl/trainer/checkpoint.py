"""Checkpoints: a Hugging Face model folder plus optimizer, scheduler, RNG and step.

Written to `step_NNNNNN.tmp` and renamed, so a crash mid-write never leaves a checkpoint
that looks complete. The last file written is `manifest.json` (every file's size and
sha256); `latest()` returns the newest checkpoint whose files match it and names the
newer ones it skips, so a truncated or damaged checkpoint (a full disk, a copy cut short)
is passed over instead of crashing the resume. Checkpoints written before manifests
existed are used when their trainer state and safetensors headers load.

A model sharded with FSDP2 is gathered into a full state dict first (a collective:
every trainer rank calls `save`, only the leader writes), so the folder is a normal
Hugging Face model folder either way. Its optimizer state is saved unsharded and
keyed by parameter name, so a resume may use any number of trainer ranks.

`extra_state`: parts of the trainer's state beyond the policy (an algorithm's extra models,
agentrl/algorithms/base.py `ExtraModel`, as `ExtraModelState`), each with `save(step_folder | None)` and
`load(step_folder)`. Every trainer rank calls them (gathers are collectives); the leader's
`save` gets the step folder before it is renamed, so a complete checkpoint holds them too.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from agentrl import transport
from agentrl.trainer import parallel

STEP_DIR = re.compile(r"^step_(\d{6,})$")
STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
LEFTOVER = re.compile(r"^step_\d{6,}\.(tmp|deleting)$")  # a save or a prune cut short
FULL_OPTIMIZER = "full_by_name"  # optimizer state from parallel.full_optimizer_state
EXTRA_OPTIMIZER_FILE = "optimizer.pt"  # in an extra model's NAME/ subfolder


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_path(run_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:06d}"


@dataclass(frozen=True)
class Checked:
    step: int
    path: Path
    problem: str | None  # None: complete
    note: str | None = None  # something worth a warning about a complete checkpoint


def step_folders(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every `step_N` folder, complete or not, newest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name))), reverse=True)


def newest_complete(run_dir: str | Path) -> tuple[Checked | None, list[Checked]]:
    """The newest checkpoint that passes `check`, and the newer ones that failed it (newest first)."""
    failed = []
    for step, path in step_folders(run_dir):
        checked = check(step, path)
        if checked.problem is None:
            return checked, failed
        failed.append(checked)
    return None, failed


def latest(run_dir: str | Path) -> tuple[int, Path] | None:
    """(step, path) of the newest complete checkpoint, or None."""
    found, _ = newest_complete(run_dir)
    return (found.step, found.path) if found else None


def check(step: int, path: Path) -> Checked:
    """Whether the folder holds every file its manifest lists, with the recorded sizes and checksums."""
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        return _check_without_manifest(step, path)
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return Checked(step, path, f"{MANIFEST_FILE} is unreadable ({error})")
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return Checked(step, path, f"{name} is missing")
        size = file.stat().st_size
        if size != expected["bytes"]:
            return Checked(step, path, f"{name} is {size} bytes, its manifest says {expected['bytes']}")
        if expected.get("sha256") and _sha256(file) != expected["sha256"]:
            return Checked(step, path, f"{name} does not match the sha256 in its manifest")
    return Checked(step, path, None)


def _check_without_manifest(step: int, path: Path) -> Checked:
    """A checkpoint from before manifests: usable if its trainer state and safetensors headers load."""
    from safetensors import SafetensorError, safe_open

    if not (path / STATE_FILE).is_file():
        return Checked(step, path, f"no {MANIFEST_FILE} and no {STATE_FILE} (a save that never finished)")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        return Checked(step, path, f"no {MANIFEST_FILE} and no *.safetensors weights")
    try:
        torch.load(path / STATE_FILE, weights_only=False, map_location="cpu")
        for file in weights:
            with safe_open(str(file), framework="pt"):
                pass
    except (OSError, RuntimeError, EOFError, ValueError, SafetensorError) as error:
        return Checked(step, path, f"no {MANIFEST_FILE}, and it does not load: {str(error).splitlines()[0]}")
    return Checked(step, path, None, note=f"has no {MANIFEST_FILE} (written by an older agentrl); its files load")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: Path, step: int, checksums: bool = True) -> None:
    """Every file's size (and sha256), written last: a folder with a manifest was saved completely."""
    files = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE):
        files[file.relative_to(folder).as_posix()] = {
            "bytes": file.stat().st_size,
            "sha256": _sha256(file) if checksums else None,
        }
    manifest = {"format": MANIFEST_FORMAT, "step": step, "files": files}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))


def save_step(config, step: int, trainer, tokenizer, comm, leader: bool, extra_state=()) -> None:
    """The checkpoint of `step` from every trainer rank of `comm` (an RL or SFT trainer: model, optimizer, schedule),
    kept as `config.checkpoint` says; every rank leaves once it is written."""
    save(
        config.run_dir,
        step,
        trainer,
        tokenizer,
        config.checkpoint.keep,
        leader=leader,
        checksums=config.checkpoint.checksums,
        extra_state=extra_state,
    )
    transport.barrier(comm)


def save(
    run_dir, step: int, trainer, tokenizer, keep: int, leader: bool = True, checksums: bool = True, extra_state=()
) -> Path | None:
    """Every trainer rank calls this (sharded models gather collectively); the leader writes and returns the path.
    `trainer`: what trains (an RL or SFT trainer), its `model`, `optimizer` and `scheduler`."""
    model, optimizer, scheduler = trainer.model, trainer.optimizer, trainer.scheduler
    model_state, optimizer_format = None, "local"
    if parallel.is_sharded(model):
        model_state = parallel.full_model_state(model)
        optimizer_state = parallel.full_optimizer_state(model, optimizer)
        optimizer_format = FULL_OPTIMIZER
    elif leader:
        optimizer_state = optimizer.state_dict()
    if not leader:
        for part in extra_state:
            part.save(None)
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
    for part in extra_state:
        part.save(tmp)
    write_manifest(tmp, step, checksums)
    if final.exists():
        _delete(final)  # a damaged checkpoint of this step that resume skipped
    os.replace(tmp, final)
    prune(run_dir, step, keep)
    return final


def load_state(path: Path, optimizer, scheduler, model=None, extra_state=()) -> int:
    """Every trainer rank: optimizer, scheduler, extra state and RNG back from `path`; `model` is needed for
    name-keyed state."""
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
    for part in extra_state:
        part.load(Path(path))
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return int(state["step"])


class ExtraModelState:
    """An algorithm's extra model (PPO's critic) as a part of `extra_state`: its weights and optimizer state in the
    step folder's `NAME/` subfolder."""

    def __init__(self, extra):
        self.extra = extra

    def save(self, step_folder: Path | None) -> None:
        """Every trainer rank (gathering sharded state is a collective); only the leader gets a folder to write."""
        extra = self.extra
        if parallel.is_sharded(extra.module):
            weights = parallel.full_model_state(extra.module)
            optimizer, form = parallel.full_optimizer_state(extra.module, extra.optimizer), FULL_OPTIMIZER
        elif step_folder is None:
            return
        else:
            weights, optimizer, form = extra.module.state_dict(), extra.optimizer.state_dict(), "local"
        if step_folder is None:
            return
        folder = Path(step_folder) / extra.name
        folder.mkdir(parents=True, exist_ok=True)
        extra.write_weights(weights, folder)
        torch.save({"optimizer": optimizer, "optimizer_format": form}, folder / EXTRA_OPTIMIZER_FILE)

    def load(self, step_folder: Path) -> None:
        """Every trainer rank: weights and optimizer state back from the step folder's `NAME/`."""
        extra = self.extra
        folder = Path(step_folder) / extra.name
        if not (folder / EXTRA_OPTIMIZER_FILE).is_file():
            raise FileNotFoundError(
                f"{folder} is missing: this checkpoint was written without the {extra.name!r} model the algorithm "
                "trains; resume it with the algorithm that wrote it, or start a new run_dir"
            )
        weights = extra.read_weights(folder)
        state = torch.load(folder / EXTRA_OPTIMIZER_FILE, weights_only=False)
        sharded = parallel.is_sharded(extra.module)
        if sharded:
            parallel.load_full_model_state(extra.module, weights)
        else:
            extra.module.load_state_dict(weights)
        if state["optimizer_format"] == FULL_OPTIMIZER:
            parallel.load_full_optimizer_state(extra.module, extra.optimizer, state["optimizer"])
        elif sharded:
            raise ValueError(
                f"{folder} was saved without parallelism.fsdp and cannot be loaded into sharded parameters: "
                "resume it with parallelism.fsdp=false"
            )
        else:
            extra.optimizer.load_state_dict(state["optimizer"])


def prune(run_dir, saved_step: int, keep: int) -> None:
    """Keep the newest `keep` checkpoints up to `saved_step` (just written, so complete); delete older ones.

    Folders above `saved_step` are ones resume skipped as damaged: they stay for the user to
    look at until this run writes a checkpoint of the same step. A folder is renamed before it
    is deleted, so a prune cut short leaves a leftover, never a half-deleted `step_N`.
    """
    root = checkpoint_dir(run_dir)
    for leftover in root.iterdir():
        if LEFTOVER.match(leftover.name) and leftover.name != f"step_{saved_step:06d}.tmp":
            shutil.rmtree(leftover, ignore_errors=True)
    older = [(step, path) for step, path in step_folders(run_dir) if step <= saved_step]
    for _, path in older[keep:]:
        _delete(path)


def _delete(folder: Path) -> None:
    """Rename, then delete: a kill midway leaves `step_N.deleting` (cleaned up later), never a partial `step_N`."""
    doomed = folder.with_name(folder.name + ".deleting")
    if doomed.exists():
        shutil.rmtree(doomed)
    os.replace(folder, doomed)
    shutil.rmtree(doomed)
