"""Loading a causal LM and its tokenizer (a LoRA checkpoint merged into its recorded base), and making sure
`model.path` holds a model before any rank loads it (the tiny quickstart model is built there on first use)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from agentrl.errors import UserError
from agentrl.models.hub import refuse_missing_model


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype: str = "float32", device: str = "cpu"):
    """A plain causal LM; a LoRA adapter folder (a LoRA run's checkpoint) loads its recorded base, merged."""
    from transformers import AutoModelForCausalLM

    from agentrl.models import adapters

    if adapters.is_adapter_folder(path):
        base = AutoModelForCausalLM.from_pretrained(adapters.recorded_base(path), dtype=getattr(torch, dtype))
        return adapters.load_adapter_model(path, base).to(device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return model.to(device)


def import_model_code() -> None:
    """Import the code that loading a causal LM and its tokenizer runs: seconds of CPU per process (transformers
    scans its model folders and pulls in torch.distributed.tensor and dynamo), spent by every model-loading rank
    side by side before rank 0 checks the model, instead of by rank 0 alone while the others wait."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401


TINY_RECORD = "agentrl_tiny.json"  # the model.tiny section a folder was built from


def ensure_model(model, texts_for_tokenizer) -> None:
    """Build the tiny model at `model.path` (the config's `model` section) if `model.tiny` asks for one and it is
    missing; else check it loads, and that a tiny model built there earlier was built from the same `model.tiny`.

    Runs on rank 0 before any other rank loads the model, so a wrong `model.path` is one
    message instead of a traceback per rank (and a hub model is downloaded once).
    """
    path = Path(model.path)
    refuse_missing_model(model)
    if path.exists() or model.tiny is None:
        check_loadable(model.path)
        if model.tiny is not None:
            _check_tiny_record(path, model.tiny)
        return
    tiny = model.tiny
    if tiny.family is not None:
        from agentrl.models.families import build_family_model
        from agentrl.models.tiny import TinyShape

        build_family_model(tiny.family, path, texts_for_tokenizer(), TinyShape(**tiny.model_dump(exclude={"family"})))
    else:
        from agentrl.models.tiny import build_tiny_model

        build_tiny_model(path, texts_for_tokenizer(), tiny)  # `model.tiny` holds a TinyShape's fields
    (path / TINY_RECORD).write_text(json.dumps(tiny.model_dump(), indent=1) + "\n")


def _check_tiny_record(path: Path, tiny) -> None:
    """A folder built from another model.tiny would otherwise be used as it is, silently keeping its old weights."""
    record = path / TINY_RECORD
    if not record.is_file():
        return  # not built by `agentrl` from a model.tiny section: the user's own folder, used as it is
    built = json.loads(record.read_text())
    wanted = tiny.model_dump()
    defaults = type(tiny)().model_dump()  # a field added since the folder was built had its default then
    differ = [
        f"{key}: {built.get(key, defaults[key])} there, {value} in the config"
        for key, value in wanted.items()
        if built.get(key, defaults[key]) != value
    ]
    if differ:
        raise UserError(
            f"model.path={path} holds a tiny model built from another model.tiny ({'; '.join(differ)}); set "
            f"model.path to a new folder (the model is built there on first use), or delete {path} to rebuild it"
        )


def check_loadable(path: str, field: str = "model.path") -> None:
    """UserError naming `field` unless `path` holds a Hugging Face model's config."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as error:
        where = "the folder" if Path(path).exists() else "it as a hub id, which"
        raise UserError(
            f"{field}={path} cannot be loaded ({str(error).splitlines()[0]}); check {where} holds a "
            "Hugging Face model (config.json, weights, tokenizer)"
        ) from None
