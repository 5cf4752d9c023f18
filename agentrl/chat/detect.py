"""Which family a model folder's tokenizer speaks: each registered family scores the tokenizer's added tokens,
its chat template and the config's model_type; the highest score wins."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.chat.family import ModelSignals
from agentrl.chat.registry import registered_names, resolve


class UnknownChatFormat(ValueError):
    """No registered family recognises the model: the message says how to name or register one."""


def detect_family(signals: ModelSignals, families: dict[str, type] | None = None) -> str:
    """The name of the family that scores highest for `signals`, among `families` (default: every registered one)."""
    families = families or {name: resolve(name) for name in registered_names()}
    scores = []
    for name, family in families.items():
        score = family.detect(signals)
        if score > 0:
            scores.append((score, name))
    if not scores:
        raise UnknownChatFormat(
            f"cannot tell the chat format of this model (model_type {signals.model_type!r}, "
            f"{len(signals.tokens)} added tokens); set chat.format to one of {', '.join(registered_names())}, or "
            "register a family of your own (docs/chat-formats.md, entry point group 'agentrl.chat_formats')"
        )
    best = max(score for score, _ in scores)
    winners = sorted(name for score, name in scores if score == best)
    if len(winners) > 1:
        raise UnknownChatFormat(
            f"the chat format of this model is ambiguous: {', '.join(winners)} fit it equally; set chat.format to one"
        )
    return winners[0]


def model_type_of(folder: str | Path) -> str | None:
    """config.json's model_type, or None where the folder has none."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return None
    return json.loads(config.read_text()).get("model_type")
