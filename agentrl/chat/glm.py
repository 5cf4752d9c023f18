"""GLM-4.5: <think>reasoning</think>, then tool calls as a name and key/value pairs,

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

String values are written as they are, other values as JSON, so a value's type comes from the tool's schema
where the tools are known (else JSON where it parses, text where not). A turn has no end token of its own: the
model stops by writing the next message's role, <|observation|> (tool results follow) or <|user|>.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from agentrl.chat.family import ChatFamily, ModelSignals
from agentrl.chat.hermes import OPEN
from agentrl.chat.qwen3 import END_THINK, THINK, THINK_THEN_CALLS
from agentrl.chat.scan import Mode, Scanner
from agentrl.chat.turn import ToolCall

ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GLM45Family(ChatFamily):
    name = "glm45"
    summary = "GLM-4.5: <think>, <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>"
    end_of_turn = ("<|user|>", "<|observation|>", "<|endoftext|>")
    closers = ()  # the next message's role token ends a turn
    reasoning_key = "reasoning_content"
    reasoning_open, reasoning_close = THINK, END_THINK
    start = "start"
    reasoning_start = "reasoning"
    modes: ClassVar[dict[str, Mode]] = THINK_THEN_CALLS

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        if "<|observation|>" in signals.tokens and "<arg_key>" in signals.tokens:
            return 100
        return 40 if signals.model_type in ("glm4_moe", "glm4") else 0

    def turn_stop(self, next_role: str | None) -> str | None:
        return "<|observation|>" if next_role == "tool" else "<|user|>"

    def call(self, scanner: Scanner, mode: str, body: str) -> ToolCall | str:
        name, _, rest = body.partition("<arg_key>")
        name = name.strip()
        if not name:
            return f"a tool call has no function name after {OPEN}: {body[:200]!r}"
        rest = "<arg_key>" + rest if rest else ""
        pairs = ARGUMENT.findall(rest)
        if ARGUMENT.sub("", rest).strip():
            return (
                f"tool call {name!r}: write each argument as <arg_key>name</arg_key><arg_value>value</arg_value>, "
                f"got {rest[:200]!r}"
            )
        types = _parameter_types(scanner.tools, name)
        return ToolCall(name, {key.strip(): _value(value, types.get(key.strip())) for key, value in pairs})


def _parameter_types(tools: list[dict] | None, name: str) -> dict[str, str]:
    for spec in tools or ():
        function = spec.get("function", spec)
        if function.get("name") == name:
            return {key: prop.get("type") for key, prop in function.get("parameters", {}).get("properties", {}).items()}
    return {}


def _value(text: str, json_type: str | None):
    if json_type == "string":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
