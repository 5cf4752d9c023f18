"""Llama 3.1-3.3: a tool call is the whole turn as JSON ({"name": ..., "parameters": {...}}), or follows
<|python_tag|> (JSON, a built-in tool's `name.call(key="value")`, or code for the code interpreter); tool results
come back in the `ipython` role; turns end with <|eot_id|>, or <|eom_id|> after a built-in tool call."""

from __future__ import annotations

import re
from typing import ClassVar

from agentrl.chat.family import ChatFamily, ModelSignals
from agentrl.chat.json_calls import calls_from_json
from agentrl.chat.scan import Mode, Scanner
from agentrl.chat.turn import ToolCall

PYTHON_TAG = "<|python_tag|>"
# A turn that opens like this is a call attempt; any other JSON-looking turn is content.
CALL_START = re.compile(r'\s*[\[{]\s*\{?\s*"(?:name|type|function)"\s*:')
BUILTIN_CALL = re.compile(r"([A-Za-z_]\w*)\.call\((.*)\)", re.DOTALL)
BUILTIN_START = re.compile(r"[A-Za-z_]\w*\.call\(")
KEYWORD = re.compile(r'\s*(\w+)\s*=\s*("(?:[^"\\]|\\.)*"|[^,]*)\s*(?:,|$)')


CALL_OPENINGS = tuple(f'{bracket}"{key}":' for bracket in ("{", "[{") for key in ("name", "type", "function"))
OPENING_PREFIXES = frozenset(opening[:end] for opening in CALL_OPENINGS for end in range(len(opening) + 1))


def _json_or_content(text: str) -> str | None:
    """A turn that opens like a JSON call is captured to its end; any other text is content from the start."""
    compact = "".join(text[:40].split())
    if compact.startswith(CALL_OPENINGS):
        return "json"
    if compact in OPENING_PREFIXES:
        return None  # "{" or '{"na': not yet known
    return "content"


class Llama3Family(ChatFamily):
    name = "llama3"
    summary = "Llama 3.x: JSON tool calls, <|python_tag|>, the ipython role, <|eot_id|> / <|eom_id|>"
    end_of_turn = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
    closers = ("<|eot_id|>", "<|eom_id|>")
    start = "start"
    modes: ClassVar[dict[str, Mode]] = {
        "start": Mode("content", {PYTHON_TAG: "python"}, decide=_json_or_content),
        "content": Mode("content", {PYTHON_TAG: "python"}),
        "json": Mode(None),  # to the end of the turn
        "python": Mode(None),
    }

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        if "<|start_header_id|>" in signals.tokens and "<|eot_id|>" in signals.tokens:
            return 100
        return 30 if signals.model_type == "llama" else 0

    def unfinished(self, scanner: Scanner, mode: str, opened_with: str, body: str) -> None:
        if mode == "json":
            if not CALL_START.match(body):
                scanner.text("content", body)
                return
            found = calls_from_json(body)
        else:
            found = self._python_tag(body)
        if any(isinstance(item, str) for item in found):
            scanner.text("content", opened_with + body)  # a malformed call stays visible, as the model wrote it
        for item in found:
            scanner.add_call(item)

    def _python_tag(self, body: str) -> list[ToolCall | str]:
        code = body.strip()
        if not code:
            return [f"{PYTHON_TAG} has no tool call after it"]
        if code[0] in "{[":
            return calls_from_json(code)
        builtin = BUILTIN_CALL.fullmatch(code)
        if builtin:
            arguments = {}
            for key, value in KEYWORD.findall(builtin.group(2)):
                arguments[key] = value[1:-1] if value.startswith('"') else value.strip()
            return [ToolCall(builtin.group(1), arguments)]
        if BUILTIN_START.match(code):
            return [f'a built-in tool call must read name.call(key="value", ...) in full, got {code[:200]!r}']
        return [ToolCall("code_interpreter", {"code": code})]
