"""Parse tool calls out of a model's turn: the Hermes/Qwen format.

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

A turn may hold several calls. Each malformed call becomes an error message (naming the
problem, in words the model can act on) instead of an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def has_calls(self) -> bool:
        """True when the turn tried to call a tool at all (well-formed or not)."""
        return bool(self.calls or self.errors)


def parse_tool_calls(text: str) -> ParsedTurn:
    turn = ParsedTurn()
    for match in CALL.finditer(text):
        call = _parse_one(match.group(1).strip())
        if isinstance(call, ToolCall):
            turn.calls.append(call)
        else:
            turn.errors.append(call)
    tail = CALL.sub("", text)
    if OPEN in tail:
        turn.errors.append(f"a {OPEN} was not closed with {CLOSE}")
    return turn


def _parse_one(body: str) -> ToolCall | str:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as error:
        return f"tool call is not valid JSON ({error.msg} at position {error.pos}): {body[:200]!r}"
    if not isinstance(payload, dict):
        return f'tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(payload).__name__}'
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return 'tool call has no "name" string'
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f'tool call {name!r}: "arguments" is a string that is not JSON: {arguments[:200]!r}'
    if not isinstance(arguments, dict):
        return f'tool call {name!r}: "arguments" must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(name, arguments)
