"""What a model path names when it is not a folder here: a Hugging Face hub id."""

from __future__ import annotations

import re
from pathlib import Path

from agentrl.errors import UserError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "name" or "namespace/name"


def refuse_missing_model(model) -> None:
    """UserError when `model.path` (a ModelConfig) is neither a folder here nor a hub id and there is no model.tiny
    to build there. Cheap: it runs before any rank imports transformers."""
    if not Path(model.path).exists() and model.tiny is None and not HUB_ID.fullmatch(model.path):
        raise UserError(
            f"model.path={model.path} does not exist and model.tiny is not set. Point model.path at a "
            "Hugging Face model folder (config.json, weights, tokenizer) or a hub id such as "
            "Qwen/Qwen2.5-0.5B-Instruct, or pass model.tiny={} (in YAML: `tiny: {}` under model:) to build a "
            "tiny random model there"
        )
