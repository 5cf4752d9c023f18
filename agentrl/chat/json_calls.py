"""Tool calls written as JSON objects ({"name": ..., "arguments": {...}}), the shape Llama 3 and Mistral write."""

from __future__ import annotations

import json

from agentrl.chat.turn import ToolCall

SEPARATORS = " \t\r\n;,"
DECODER = json.JSONDecoder()  # stateless: one for every parse


def call_from_object(payload, argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | str:
    """One decoded JSON value -> a ToolCall, or what is wrong with it (for the model to read)."""
    if not isinstance(payload, dict):
        return f'a tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(payload).__name__}'
    if isinstance(payload.get("function"), dict):  # {"type": "function", "function": {"name": ..., ...}}
        payload = {**payload["function"], "id": payload.get("id")}
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return 'a tool call has no "name" string'
    key = next((k for k in argument_keys if k in payload), None)
    arguments = payload[key] if key else {}
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f'tool call {name!r}: "{key}" is a string that is not JSON: {arguments[:200]!r}'
    if not isinstance(arguments, dict):
        return f'tool call {name!r}: "{key}" must be a JSON object, got {type(arguments).__name__}'
    call_id = payload.get("id")
    return ToolCall(name, arguments, call_id if isinstance(call_id, str) else None)


def calls_from_json(text: str, argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> list[ToolCall | str]:
    """JSON objects (or lists of them) one after another, apart by whitespace, ';' or ',' -> their calls; text
    that is not JSON (a call cut short) ends the list with an error naming where, after the calls before it."""
    decoder, found, at = DECODER, [], 0
    while True:
        while at < len(text) and (text[at] in SEPARATORS or text[at] in "[]"):  # a list's calls one by one, so a
            at += 1  # list cut short keeps its complete calls
        if at == len(text):
            return found
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as error:
            found.append(f"tool call is not valid JSON ({error.msg} at position {error.pos}): {text[:200]!r}")
            return found
        found.append(call_from_object(value, argument_keys))


def arguments_from_text(name: str, text: str) -> dict | str:
    """A call's arguments written as JSON text -> the mapping, or what is wrong with it (for the model to read)."""
    try:
        arguments = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as error:
        return f"tool call {name!r}: arguments are not valid JSON ({error.msg} at position {error.pos}): {text[:200]!r}"
    if not isinstance(arguments, dict):
        return f"tool call {name!r}: arguments must be a JSON object, got {type(arguments).__name__}"
    return arguments
