"""The Hermes / Qwen2.5 format: tool calls as JSON in <tool_call> tags.

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

A turn may hold several calls. Each malformed call becomes an error message (naming the
problem, in words the model can act on) instead of an exception. `parse_tool_calls` is what
ToolEnv.step has always parsed (agentrl/env/tool_calls.py re-exports it); the Hermes family's
streaming parser gives the same turn.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from agentrl.chat.family import ChatFamily, ModelSignals
from agentrl.chat.scan import Mode, Scanner
from agentrl.chat.turn import ParsedTurn, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def parse_tool_calls(text: str) -> ParsedTurn:
    if OPEN not in text:  # no call: what the scan below finds, without the regular expressions
        return ParsedTurn(content=text.strip())
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
    turn.content = tail.strip()
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


class HermesFamily(ChatFamily):
    name = "hermes"
    summary = "Hermes / Qwen2.5: <tool_call>{json}</tool_call>, turns end with <|im_end|>"
    end_of_turn = ("<|im_end|>", "<|endoftext|>")
    closers = ("<|im_end|>",)
    modes: ClassVar[dict[str, Mode]] = {
        "content": Mode("content", {OPEN: "call"}),
        "call": Mode(None, {CLOSE: "content"}),
    }

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        if "<|im_start|>" in signals.tokens or "<|im_start|>" in signals.template:
            return 60
        return 40 if OPEN in signals.template else 0

    def parse(self, text: str, *, tools: list[dict] | None = None, in_reasoning: bool = False) -> ParsedTurn:
        return parse_tool_calls(text)

    def call(self, scanner: Scanner, mode: str, body: str) -> ToolCall | str:
        return _parse_one(body.strip())

    def unfinished(self, scanner: Scanner, mode: str, opened_with: str, body: str) -> None:
        scanner.text("content", opened_with + body)
        scanner.add_call(f"a {OPEN} was not closed with {CLOSE}")
