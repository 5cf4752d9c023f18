"""Mistral: [TOOL_CALLS] then a JSON list of calls, each with a 9-character id ([TOOL_CALLS]name[CALL_ID]id[ARGS]{...}
in the newer tokenizers), tool results in [TOOL_RESULTS] with the call's id; reasoning (Magistral) in [THINK];
turns end with </s>."""

from __future__ import annotations

import re
import uuid
from typing import ClassVar

from agentrl.chat.family import ChatFamily, ModelSignals, decide_content
from agentrl.chat.json_calls import arguments_from_text, calls_from_json
from agentrl.chat.scan import Mode, Scanner
from agentrl.chat.turn import ToolCall

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
THINK, END_THINK = "[THINK]", "[/THINK]"
CALL_ID_SHAPE = re.compile(r"[A-Za-z0-9]{9}")


class MistralFamily(ChatFamily):
    name = "mistral"
    summary = "Mistral: [TOOL_CALLS] with 9-character call ids, [TOOL_RESULTS], [THINK]; turns end with </s>"
    end_of_turn = ("</s>",)
    closers = ("</s>",)
    reasoning_key = "reasoning_content"
    reasoning_open, reasoning_close = THINK, END_THINK
    start = "start"
    modes: ClassVar[dict[str, Mode]] = {
        "start": Mode("content", {THINK: "reasoning", TOOL_CALLS: "calls"}, decide=decide_content),
        "reasoning": Mode("reasoning", {END_THINK: "content"}),
        "content": Mode("content", {TOOL_CALLS: "calls"}),
        "calls": Mode(None, {TOOL_CALLS: "calls"}),  # to the next [TOOL_CALLS] or the end of the turn
    }

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        if TOOL_CALLS in signals.tokens or "[INST]" in signals.tokens:
            return 100
        return 30 if signals.model_type in ("mistral", "mixtral", "ministral") else 0

    def close(self, scanner: Scanner, mode: str, body: str, marker: str) -> str | None:
        self._add(scanner, body, marker)
        return None

    def unfinished(self, scanner: Scanner, mode: str, opened_with: str, body: str) -> None:
        self._add(scanner, body, opened_with)

    def _add(self, scanner: Scanner, body: str, opened_with: str) -> None:
        found = self._calls(body.strip())
        if any(isinstance(item, str) for item in found):
            scanner.text("content", opened_with + body)  # a malformed call stays visible, as the model wrote it
        for item in found:
            scanner.add_call(item)

    def _calls(self, body: str) -> list[ToolCall | str]:
        if body[:1] in ("[", "{"):
            return calls_from_json(body, ("arguments", "parameters"))
        if ARGS in body:  # name[CALL_ID]id[ARGS]{...}
            head, _, arguments = body.partition(ARGS)
            name, _, call_id = (part.strip() for part in head.partition(CALL_ID))
            parsed = arguments_from_text(name, arguments)
            return [parsed if isinstance(parsed, str) else ToolCall(name, parsed, call_id or None)]
        if not body:
            return [f"{TOOL_CALLS} has no tool call after it"]
        shape = '[{"name": ..., "arguments": {...}}]'
        return [f"after {TOOL_CALLS} write a JSON list of calls {shape}, got {body[:200]!r}"]

    def new_call_id(self) -> str:
        return uuid.uuid4().hex[:9]

    def valid_call_id(self, call_id: str | None) -> bool:
        return bool(call_id) and CALL_ID_SHAPE.fullmatch(call_id) is not None
