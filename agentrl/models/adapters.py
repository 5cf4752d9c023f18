"""LoRA adapter folders (PEFT): what a LoRA run's checkpoint is, the base model it records, and loading it onto that
base, as a model to train on or merged into a plain one.

A checkpoint is a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) whose
`base_model_name_or_path` is the base model's absolute path (or a hub id).
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.errors import UserError
from agentrl.models.hub import HUB_ID

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def base_folder(path: str) -> str:
    """What a checkpoint records as its base: the absolute path of a local folder, else the hub id as given."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def recorded_base(adapter_path: str | Path) -> str:
    """The base model an adapter folder records; UserError naming the fix when it is missing."""
    config = json.loads((Path(adapter_path) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise UserError(
            f"{adapter_path} is a LoRA adapter folder without base_model_name_or_path in {ADAPTER_CONFIG}; add the "
            "base model's folder there"
        )
    if not Path(base).exists() and (Path(base).is_absolute() or not HUB_ID.fullmatch(base)):
        raise UserError(
            f"{adapter_path} is a LoRA adapter for the base model {base}, which does not exist here; put the base "
            f"model back at {base}, or edit base_model_name_or_path in {Path(adapter_path) / ADAPTER_CONFIG} to "
            "where it is now"
        )
    return base


def load_adapter_model(adapter_path: str | Path, base, trainable: bool = False):
    """`base` (a loaded causal LM) with the adapter of `adapter_path`: a PeftModel (trainable adapters), or
    merged into a plain model when not trainable."""
    (PeftModel,) = peft_names("PeftModel")
    model = PeftModel.from_pretrained(base, str(adapter_path), is_trainable=trainable)
    return model if trainable else model.merge_and_unload()


def peft_base(model):
    """The causal LM itself: under PEFT's wrapper (model.lora) the model it wraps, its LoRA layers in place; any other
    model as it is."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def peft_names(*names: str) -> tuple:
    try:
        import peft
    except ImportError:
        raise UserError("model.lora and LoRA checkpoints need PEFT: pip install 'agentrl[lora]' (peft)") from None
    return tuple(getattr(peft, name) for name in names)
