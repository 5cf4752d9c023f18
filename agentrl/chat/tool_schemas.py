"""Whether a chat template renders tool schemas: each tool rendered without an error and with its name in the text."""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.chat.errors import ChatTemplateError

HEAD = [{"role": "user", "content": "u"}]


@dataclass(frozen=True)
class UnrenderedTool:
    """A tool the template does not render: its name, and what the template did (in words, one line)."""

    name: str
    problem: str


def tool_name(tool) -> str:
    """The name a tool schema gives its function (OpenAI's {"type": "function", "function": {...}} or the bare
    function), or "" where it has none."""
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""


def unrendered_tool(codec, tools: list[dict], messages: list[dict] | None = None) -> UnrenderedTool | None:
    """The first of `tools` that `codec`'s template cannot render after `messages` (a user message by default):
    rendering raises, or leaves the tool's name out of the text; None where every tool renders, and where the
    template raises on the messages without tools too (not a tool's fault). Renders once where all tools render;
    each tool alone to name the one that does not."""
    head = messages or HEAD
    try:
        text = codec.render(head, tools, True)
    except ChatTemplateError:
        text = None
        try:
            codec.render(head, None, True)
        except ChatTemplateError:
            return None
    if text is not None and all(tool_name(tool) in text for tool in tools):
        return None
    family = codec.family.name
    for tool in tools:
        name = tool_name(tool)
        try:
            alone = codec.render(head, [tool], True)
        except ChatTemplateError as error:
            return UnrenderedTool(name, f"the {family} chat template raised on it ({_one_line(error)})")
        if name not in alone:
            return UnrenderedTool(name, f"the {family} chat template leaves it out (its name is not in the prompt)")
    names = ", ".join(repr(tool_name(tool)) for tool in tools)
    return UnrenderedTool(names, f"the {family} chat template renders each alone but raises on them together")


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    prefix = "chat template refused these messages: "
    return text.split(prefix, 1)[1] if prefix in text else text
