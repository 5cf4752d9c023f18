"""Qwen3: the Hermes tool calls after an optional <think> block; its template drops the reasoning of turns before
the last user message, and with thinking off it writes an empty think block in the prompt."""

from __future__ import annotations

from typing import ClassVar

from agentrl.chat.family import ChatFamily, ModelSignals, decide_content
from agentrl.chat.hermes import CLOSE, OPEN, HermesFamily
from agentrl.chat.scan import Mode

THINK, END_THINK = "<think>", "</think>"
# A turn that may open with <think>reasoning</think>, then content and <tool_call>...</tool_call> blocks (Qwen3's and
# GLM-4.5's shape; what is inside a call differs, and each family's `call` reads it).
THINK_THEN_CALLS: dict[str, Mode] = {
    "start": Mode("content", {THINK: "reasoning", OPEN: "call"}, decide=decide_content),
    "reasoning": Mode("reasoning", {END_THINK: "content"}),
    "content": Mode("content", {OPEN: "call"}),
    "call": Mode(None, {CLOSE: "content"}),
}


class Qwen3Family(HermesFamily):
    name = "qwen3"
    summary = "Qwen3: <think>reasoning</think>, then Hermes <tool_call>s; thinking on or off"
    reasoning_key = "reasoning_content"
    reasoning_open, reasoning_close = THINK, END_THINK
    start = "start"
    reasoning_start = "reasoning"
    modes: ClassVar[dict[str, Mode]] = THINK_THEN_CALLS

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        if "<|im_start|>" not in signals.tokens:
            return 0
        thinks = THINK in signals.tokens or END_THINK in signals.template
        return 90 if thinks or signals.model_type in ("qwen3", "qwen3_moe") else 0

    parse = ChatFamily.parse  # the scanner's: Hermes' own regex parse knows no reasoning
