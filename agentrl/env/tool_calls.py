"""Parse tool calls out of a model's turn: the Hermes/Qwen format.

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

A turn may hold several calls. Each malformed call becomes an error message (naming the
problem, in words the model can act on) instead of an exception. The parser is the Hermes
family's (agentrl/chat/hermes.py); other formats are in agentrl/chat/ (docs/chat-formats.md).
"""

from __future__ import annotations

from agentrl.chat.hermes import CALL, CLOSE, OPEN, parse_tool_calls
from agentrl.chat.turn import ParsedTurn, ToolCall

__all__ = ["CALL", "CLOSE", "OPEN", "ParsedTurn", "ToolCall", "parse_tool_calls"]
