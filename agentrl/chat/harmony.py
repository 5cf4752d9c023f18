"""gpt-oss's harmony format: a turn is messages on channels. `analysis` is reasoning, `final` (and `commentary`
without a recipient, a preamble) is content, a message `to=functions.name` is a tool call whose body is its JSON
arguments. The prompt ends with `<|start|>assistant`, so a turn opens with its first message's header:

    <|channel|>analysis<|message|>...<|end|>
    <|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1}<|call|>

(one line in the turn).
A turn ends with <|call|> (a tool call) or <|return|> (the final answer); the template writes <|end|> in place of
<|return|> once a turn is history, and drops the analysis of turns that ended in a final answer.
"""

from __future__ import annotations

import re
from typing import ClassVar

from agentrl.chat.family import ChatFamily, ModelSignals
from agentrl.chat.json_calls import arguments_from_text
from agentrl.chat.scan import Mode, Scanner
from agentrl.chat.turn import ToolCall

START, MESSAGE, END, CALL, RETURN = "<|start|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"
CHANNEL = "<|channel|>"
MESSAGE_ENDS = {END: "between", CALL: "between", RETURN: "between"}
RECIPIENT = re.compile(r"to=([^\s<]+)")
CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


class HarmonyFamily(ChatFamily):
    name = "harmony"
    summary = "gpt-oss harmony: analysis / commentary / final channels, to=functions.x, <|call|>, <|return|>"
    end_of_turn = (RETURN, CALL, "<|endoftext|>")
    closers = (CALL, RETURN, END)
    markup_ends = (CALL, RETURN)  # <|call|> closes a call's arguments: a call without it was cut
    reasoning_key = "thinking"
    start = "header"
    modes: ClassVar[dict[str, Mode]] = {
        "header": Mode(None, {MESSAGE: "final"}),  # the header decides the body's mode
        "analysis": Mode("reasoning", MESSAGE_ENDS, separate=True),
        "final": Mode("content", MESSAGE_ENDS, separate=True),
        "call": Mode(None, MESSAGE_ENDS),
        "between": Mode("content", {START: "header"}),
    }

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        if CHANNEL in signals.tokens and CALL in signals.tokens:
            return 100
        return 50 if signals.model_type == "gpt_oss" else 0

    def close(self, scanner: Scanner, mode: str, body: str, marker: str) -> str | None:
        if mode == "header":
            recipient = RECIPIENT.search(body)
            scanner.state["recipient"] = recipient.group(1) if recipient else None
            if recipient:
                return "call"
            channel = CHANNEL_NAME.search(body)
            return "analysis" if channel and channel.group(1) == "analysis" else "final"
        scanner.add_call(self._call(scanner.state.get("recipient") or "", body))
        return None

    def _call(self, recipient: str, body: str) -> ToolCall | str:
        name = recipient.removeprefix("functions.")
        arguments = arguments_from_text(name, body)
        if isinstance(arguments, str):
            if recipient == "python":  # the built-in python tool takes code, not JSON
                return ToolCall(name, {"code": body.strip()})
            return arguments
        return ToolCall(name, arguments)

    def unfinished(self, scanner: Scanner, mode: str, opened_with: str, body: str) -> None:
        if mode == "header":
            if RECIPIENT.search(body):
                scanner.add_call(
                    f"a tool call's header ({body.strip()[:200]!r}) was not followed by {MESSAGE} and "
                    "its arguments (the turn ended first)"
                )
            return
        recipient = scanner.state.get("recipient") or ""
        scanner.text("content", body)
        scanner.add_call(f"tool call to {recipient!r} was not closed with {CALL} (the turn ended inside it)")

    def assistant_message(self, turn, call_ids=None) -> dict:
        message = super().assistant_message(turn, call_ids)
        if turn.calls and message["content"]:
            # the template writes a call turn's text on the analysis channel, from `thinking` or `content`, not both
            message["thinking"] = "\n".join(part for part in (turn.reasoning, turn.content) if part)
            message["content"] = ""
        return message
