"""What every typed section is built from (the config's, an algorithm's options, a sweep spec's), and the error a
config that cannot run raises: a leaf any module may import, below agentrl/config/ and agentrl/algorithms/."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.errors import UserError


class ConfigError(UserError, ValueError):
    """A config that cannot run; the message names the field and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AlgorithmSection(Section):
    """Base of every algorithm's options (agentrl/algorithms/base.py); `name` picks the algorithm."""

    name: str = Field("grpo", description="Registered algorithm name (`agentrl algorithms`) or `module:Class`.")


def format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field; check the spelling against `agentrl config-doc`"
        elif item["type"] == "missing":
            message = "required field is missing; add it to the YAML or pass it as key=value"
        if item["type"] == "nested_section":  # already one line per field, each named
            lines.append(f"  {message.strip()}" if not message.startswith("  ") else message)
            continue
        whole_config = not item["loc"]  # a cross-field check: its message already names the values
        got = "" if whole_config or item["type"] in ("missing", "extra_forbidden") else f" (got {item['input']!r})"
        lines.append(f"  {field}: {message}{got}")
    return "\n".join(lines)
