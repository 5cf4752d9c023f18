"""Reading a config: YAML, `key=value` overrides, fields renamed since, validation once; and saving it resolved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agentrl.config.schema import Config
from agentrl.sections import ConfigError, format_validation_error

# Fields that moved when `trainer` and `rollout` were split into one section per component:
# old dotted path -> new dotted path (None: removed, nothing read it).
RENAMED_FIELDS: dict[str, str | None] = {
    "trainer.lr": "optimizer.lr",
    "trainer.betas": "optimizer.betas",
    "trainer.weight_decay": "optimizer.weight_decay",
    "trainer.max_grad_norm": "optimizer.max_grad_norm",
    "trainer.lr_schedule": "lr_scheduler.decay",
    "trainer.warmup_steps": "lr_scheduler.warmup_steps",
    "trainer.min_lr_ratio": "lr_scheduler.min_lr_ratio",
    "trainer.clip_eps_low": "algorithm.clip_eps_low",
    "trainer.clip_eps_high": "algorithm.clip_eps_high",
    "trainer.kl_coef": "algorithm.kl_coef",
    "trainer.entropy_coef": "algorithm.entropy_coef",
    "trainer.adv_std_norm": "algorithm.adv_std_norm",
    "trainer.fsdp": "parallelism.fsdp",
    "trainer.mixed_precision": "parallelism.mixed_precision",
    "trainer.activation_checkpointing": "parallelism.activation_checkpointing",
    "trainer.seed": None,
    "rollout.backend": "rollout.engine.backend",
    "rollout.max_batch_size": "rollout.engine.max_batch_size",
    "rollout.tp_size": "rollout.engine.tp_size",
    "rollout.mem_fraction_static": "rollout.engine.mem_fraction_static",
    "rollout.sglang_kwargs": "rollout.engine.kwargs",
    "runtime.weight_sync": "weights.transport",
    "runtime.weight_bucket_mb": "weights.bucket_mb",
}


def migrate_renamed(data: dict) -> list[str]:
    """Move fields of older configs to their new place, in place; a note per field moved."""
    notes = []
    for old, new in RENAMED_FIELDS.items():
        section, field = old.split(".")
        node = data.get(section)
        if not isinstance(node, dict) or field not in node:
            continue
        value = node.pop(field)
        if new is None:
            notes.append(f"{old} is no longer read and was ignored; remove it")
            continue
        path = new.split(".")
        target = data
        for part in path[:-1]:
            target = target.setdefault(part, {})
        if path[-1] in target:
            raise ConfigError(f"{old} was renamed {new}, and both are set; keep only {new}")
        target[path[-1]] = value
        notes.append(f"{old} is now {new}; please rename it")
    return notes


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not key=value; write it like rollout.group_size=8")
    return key.strip().split("."), parse_yaml(raw, f"override {text!r}") if raw.strip() else ""


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        parts = []
        for text_attr, mark_attr in (("context", "context_mark"), ("problem", "problem_mark")):
            said, mark = getattr(error, text_attr, None), getattr(error, mark_attr, None)
            if said:
                parts.append(said + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""))
        detail = ": ".join(parts) or str(error).splitlines()[0]
        raise ConfigError(f"{source} is not valid YAML, {detail}; fix the YAML syntax there") from None


def apply_override(data: dict, path: list[str], value: Any) -> None:
    _parent(data, path)[path[-1]] = value


def _parent(data: dict, path: list[str]) -> dict:
    """The mapping that holds `path`'s last key, made on the way where missing."""
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part} is a value, not a section")
        node = child
    return node


def merge_override(data: dict, path: list[str], value: Any) -> None:
    """`apply_override`, except that a mapping merges into a mapping already there, key by key and at every depth,
    so `rollout: {tasks_per_step: 16}` changes that one field as `rollout.tasks_per_step: 16` does and keeps the
    rest of the section (a sweep spec's `overrides`)."""
    node = _parent(data, path)
    if isinstance(value, dict) and isinstance(node.get(path[-1]), dict):
        for key, inner in value.items():
            merge_override(node[path[-1]], [str(key)], inner)
    else:
        node[path[-1]] = value


def from_dict(data: dict, source: str = "<dict>") -> Config:
    import copy

    data = copy.deepcopy(data)
    notes = migrate_renamed(data)
    try:
        config = Config.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, source)) from None
    config._notes = notes + config._notes
    return config


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read YAML at `path` (or start empty), apply `key=value` overrides, validate."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"config file {path} does not exist; pass a YAML file such as launch/configs/quickstart.yaml"
            )
        try:
            text = path.read_text()
        except OSError as error:
            raise ConfigError(f"config file {path} cannot be read ({error.strerror}); check its permissions") from None
        data = parse_yaml(text, f"config file {path}") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(data).__name__}")
    for text in overrides:
        apply_override(data, *parse_override(text))
    return from_dict(data, source=str(path) if path else "overrides")


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
