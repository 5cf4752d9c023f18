"""A test plug-in chat format: calls as `||name {json}||`, turns ending in <|done|>."""

from agentrl.chat.family import ChatFamily
from agentrl.chat.json_calls import arguments_from_text
from agentrl.chat.scan import Mode
from agentrl.chat.turn import ToolCall


class PipeFamily(ChatFamily):
    name = "pipe"
    summary = "a test plug-in: ||name {json}||"
    end_of_turn = ("<|done|>",)
    closers = ("<|done|>",)
    modes = {  # noqa: RUF012 - read only, as the built-in families' class attribute
        "content": Mode("content", {"||": "call"}),
        "call": Mode(None, {"||": "content"}),
    }

    @classmethod
    def detect(cls, signals):
        return 100 if "<|done|>" in signals.tokens else 0

    def call(self, scanner, mode, body):
        name, _, arguments = body.strip().partition(" ")
        parsed = arguments_from_text(name, arguments)
        return parsed if isinstance(parsed, str) else ToolCall(name, parsed)
