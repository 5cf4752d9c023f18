"""`agentrl config-doc [--write FILE]`: the config reference, generated from the schema's fields and docstrings
(docs/config.md)."""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Annotated, Literal

from agentrl.config.schema import Config
from agentrl.errors import UserError
from agentrl.sections import AlgorithmSection, Section

# Sections the SFT config shares with the RL config (documented once, under the RL reference).
SHARED_SECTIONS = ("model", "optimizer", "lr_scheduler", "parallelism", "checkpoint", "logging")
START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--write",
        metavar="FILE",
        help="replace the reference between FILE's config-reference markers instead (docs/config.md)",
    )


def main(args) -> int:
    if not args.write:
        print(config_reference())
        return 0
    path = Path(args.write)
    text = path.read_text() if path.is_file() else ""
    if START not in text or END not in text.split(START, 1)[1]:
        raise UserError(f"{path} has no {START} ... {END} block to replace")
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    path.write_text(f"{before}{START}\n{config_reference().strip()}\n{END}{after}")
    print(f"wrote the config reference into {path}")
    return 0


def config_reference() -> str:
    """Markdown tables per section: field, type (every Literal's choices), default, description.

    A section chosen by a key (`rollout.engine` by `backend`, `algorithm` by `name`) gets one
    table per choice, so each choice's own options are listed where they apply. The `agentrl sft`
    config's own fields follow.
    """
    top = [_row(name, field) for name, field in Config.model_fields.items() if _section_of(field) is None]
    out = ["### top level\n", *_table(top)]
    for name, field in Config.model_fields.items():
        if name == "algorithm":
            out += _algorithm_tables()
        elif (section := _section_of(field)) is not None:
            out.append(f"\n### `{name}`\n\n{_doc(section)}\n")
            out += _table(_section_rows(name, section))
            out += _choice_tables(name, section)
    out.append(sft_reference())
    return "\n".join(out)


def _table(rows: list[str]) -> list[str]:
    return ["| field | type | default | description |", "|---|---|---|---|", *rows]


def _doc(section: type) -> str:

    return inspect.cleandoc(section.__doc__ or "")


def _section_of(field) -> type | None:
    """The Section class a field holds (also through `X | None`), or None for a plain value."""
    candidates = [field.annotation, *typing.get_args(field.annotation)]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, Section)), None)


def _union_members(field) -> list[type]:
    """The members of a discriminated union of sections (rollout.engine), else []."""
    annotation = field.annotation
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    sections = [m for m in typing.get_args(annotation) if isinstance(m, type) and issubclass(m, Section)]
    return sections if len(sections) > 1 else []


def _section_rows(prefix: str, section: type, skip: tuple[str, ...] = ()) -> list[str]:
    """Rows of a section's fields; a nested section's fields follow as `prefix.field.sub`."""
    rows = []
    for name, field in section.model_fields.items():
        if name in skip:
            continue
        nested = _section_of(field)
        if _union_members(field):
            rows.append(_row(f"{prefix}.{name}", field))
        elif nested is not None:
            summary = field.description or _doc(nested).split("\n\n")[0].replace("\n", " ")
            rows.append(f"| `{prefix}.{name}` | section | | {summary} |")
            rows += _section_rows(f"{prefix}.{name}", nested)
        else:
            rows.append(_row(f"{prefix}.{name}", field))
    return rows


def _choice_tables(prefix: str, section: type) -> list[str]:
    out = []
    for name, field in section.model_fields.items():
        for member in _union_members(field):
            key = member.model_fields[field.discriminator].default if field.discriminator else member.__name__
            out.append(f"\n#### `{prefix}.{name}` with `{field.discriminator}: {key}`\n\n{_doc(member)}\n")
            out += _table(_section_rows(f"{prefix}.{name}", member))
    return out


def _algorithm_tables() -> list[str]:
    from agentrl.algorithms.registry import registered_names, resolve

    out = [f"\n### `algorithm`\n\n{Config.model_fields['algorithm'].description}\n"]
    out += _table([_row("algorithm.name", AlgorithmSection.model_fields["name"])])
    for name in registered_names():
        algorithm = resolve(name)
        out.append(f"\n#### `algorithm.name: {name}`\n\n{algorithm.summary}\n")
        out += _table(_section_rows("algorithm", algorithm.Options, skip=("name",)))
    return out


def _type_name(annotation) -> str:
    if typing.get_origin(annotation) is Literal:
        return " \\| ".join(repr(choice) for choice in typing.get_args(annotation))
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) in (types.UnionType, typing.Union):
        return " \\| ".join(_type_name(arg) for arg in args)
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation.__name__
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", None) if not args else str(annotation).replace("typing.", "")


def _row(name: str, field) -> str:
    if field.is_required():
        default = "required"
    elif field.default_factory is not None:
        default = repr(field.default_factory())
    else:
        default = repr(field.default)
    if len(default) > 40:
        default = default.split("(")[0]
    return f"| `{name}` | `{_type_name(field.annotation)}` | `{default}` | {field.description or ''} |"


def sft_reference() -> str:
    """The SFT config's part of `agentrl config-doc`: its own fields; the shared sections are those above."""
    from agentrl.sft.config import SFTConfig, SFTSection

    top = [_row(name, field) for name, field in SFTConfig.model_fields.items() if _section_of(field) is None]
    shared = ", ".join(f"`{name}`" for name in SHARED_SECTIONS)
    out = [
        "\n### SFT config (`agentrl sft CONFIG`)\n",
        f"{_doc(SFTConfig)} Its sections {shared} are the RL config's, as above (of `logging`, all but "
        "`sample_every` and `num_samples` apply); these fields are its own.\n",
        *_table(top),
        f"\n### `sft`\n\n{_doc(SFTSection)}\n",
        *_table(_section_rows("sft", SFTSection)),
    ]
    return "\n".join(out)
