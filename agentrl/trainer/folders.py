"""Model folders a command is pointed at: a run's checkpoint, a run folder (its newest complete checkpoint) or a
Hugging Face model folder; what `agentrl eval`, `agentrl serve` and `agentrl export-merged` check first."""

from __future__ import annotations

import re
from pathlib import Path

from agentrl.errors import UserError

WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
STEP_NAME = re.compile(r"^step_(\d+)$")


def newest_checkpoint(run_dir: Path) -> tuple[Path, str]:
    from agentrl.trainer import checkpoint

    found, damaged = checkpoint.newest_complete(run_dir)
    if found is None:
        raise UserError(
            f"--checkpoint {run_dir} is a run folder without a complete checkpoint "
            f"({len(damaged)} damaged or unfinished); pass a checkpoint folder or a model folder"
        )
    return found.path, f"--checkpoint {run_dir} is a run folder: evaluating its newest checkpoint, {found.path}"


def check_model_folder(path: Path, given: str) -> None:
    """A Hugging Face model folder (config.json, weights and a tokenizer), or a LoRA checkpoint (an adapter
    folder whose recorded base model exists, and a tokenizer)."""
    from agentrl.models import adapters

    missing = []
    if adapters.is_adapter_folder(path):
        adapters.recorded_base(path)  # names the fix when the base model is gone
    elif not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        missing.append("weights (*.safetensors or pytorch_model*.bin)")
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()):
        missing.append("a tokenizer (tokenizer.json / tokenizer_config.json)")
    if missing:
        raise UserError(
            f"--checkpoint {given} is not a model folder: it has no {', '.join(missing)}; pass a run's checkpoint "
            "folder (RUN_DIR/checkpoints/step_NNNNNN), a run folder, or a Hugging Face model folder"
        )


def model_folder(given: str, label: str) -> tuple[Path, str | None]:
    """The model folder `given` names (a run folder means its newest complete checkpoint), checked; and a note when
    a run folder was resolved. `label` starts the error message (the command and its argument)."""
    path, note = Path(given), None
    if not path.is_dir():
        raise UserError(
            f"{label}: no such folder; pass a run's checkpoint folder (RUN_DIR/checkpoints/step_NNNNNN), "
            "a run folder (its newest checkpoint) or a Hugging Face model folder"
        )
    if (path / "checkpoints").is_dir() and not (path / "config.json").is_file():
        path, note = newest_checkpoint(path)
    check_model_folder(path, given)
    return path, note
