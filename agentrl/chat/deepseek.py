"""DeepSeek V3 and R1: tool calls between <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>, each

    <｜tool▁call▁begin｜>function<｜tool▁sep｜>name
    ```json
    {"a": 1}
    ```<｜tool▁call▁end｜>

(V3.1 writes `name<｜tool▁sep｜>{"a": 1}`; both parse). Turns end with <｜end▁of▁sentence｜>. R1 thinks first: its
prompt ends with `<think>\\n`, the turn with `</think>`, then the answer; its template drops the reasoning of every
earlier turn (and the prompt's `<think>`), so R1 conversations are never append-only.
"""

from __future__ import annotations

import re
from typing import ClassVar

from agentrl.chat.family import ChatFamily, ModelSignals, decide_content
from agentrl.chat.json_calls import arguments_from_text
from agentrl.chat.scan import Mode, Scanner
from agentrl.chat.turn import ToolCall

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
EOS = "<｜end▁of▁sentence｜>"
THINK, END_THINK = "<think>", "</think>"
FENCED = re.compile(r"\s*([^\n]*?)\s*\n\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*", re.DOTALL)


class DeepSeekV3Family(ChatFamily):
    name = "deepseek_v3"
    summary = "DeepSeek V3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name + JSON block"
    end_of_turn = (EOS,)
    closers = (EOS,)
    arguments_as_text = True
    modes: ClassVar[dict[str, Mode]] = {
        "content": Mode("content", {CALLS_BEGIN: "calls", CALL_BEGIN: "call"}),
        "calls": Mode(None, {CALL_BEGIN: "call", CALLS_END: "content"}),  # between calls: only whitespace
        "call": Mode(None, {CALL_END: "calls"}),
    }

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        if CALLS_BEGIN in signals.tokens or "<｜Assistant｜>" in signals.tokens:
            return 90
        return 30 if signals.model_type == "deepseek_v3" else 0

    def close(self, scanner: Scanner, mode: str, body: str, marker: str) -> str | None:
        if mode == "call":
            scanner.add_call(self._call(body))
        elif body.strip():
            scanner.text("content", body)  # text between calls stays visible
        return None

    def unfinished(self, scanner: Scanner, mode: str, opened_with: str, body: str) -> None:
        if mode == "calls":  # complete calls, the closing marker cut: nothing is missing
            if body.strip():
                scanner.text("content", body)
            return
        super().unfinished(scanner, mode, opened_with, body)

    def _call(self, body: str) -> ToolCall | str:
        kind, sep, rest = body.partition(SEP)
        if not sep:
            return f"a tool call has no {SEP} between its type and name: {body[:200]!r}"
        fenced = FENCED.fullmatch(rest)
        if kind.strip() == "function" and fenced:  # V3: function<sep>name\n```json\n{...}\n```
            name, arguments = fenced.group(1), fenced.group(2)
        else:  # V3.1: name<sep>{...}
            name, arguments = kind.strip(), rest
        parsed = arguments_from_text(name.strip(), arguments)
        return parsed if isinstance(parsed, str) else ToolCall(name.strip(), parsed)


class DeepSeekR1Family(DeepSeekV3Family):
    name = "deepseek_r1"
    summary = "DeepSeek R1: <think> reasoning (opened by the prompt), then the V3 tool calls"
    reasoning_key = "reasoning_content"
    reasoning_open, reasoning_close = THINK, END_THINK
    start = "start"
    reasoning_start = "reasoning"
    modes: ClassVar[dict[str, Mode]] = {
        **DeepSeekV3Family.modes,
        "start": Mode("content", {THINK: "reasoning", CALLS_BEGIN: "calls", CALL_BEGIN: "call"}, decide=decide_content),
        "reasoning": Mode("reasoning", {END_THINK: "content"}),
    }

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        base = super().detect(signals)
        return base + 5 if base and END_THINK in signals.template else 0
