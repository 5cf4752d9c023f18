"""Chat formats of model families: parse a turn into content, reasoning and tool calls (whole or streamed), render
messages through the model's own chat template, and build multi-turn token ids incrementally (docs/chat-formats.md).

Nothing here imports torch: a codec needs only a Hugging Face tokenizer.
"""

from agentrl.chat.codec import ChatCodec, ChatTemplateError, NotAppendOnly, TokenStream, load_codec
from agentrl.chat.detect import UnknownChatFormat, detect_family
from agentrl.chat.family import ChatFamily, ModelSignals
from agentrl.chat.registry import register, registered_names, resolve
from agentrl.chat.turn import ParsedTurn, ToolCall, TurnDelta

__all__ = [
    "ChatCodec",
    "ChatFamily",
    "ChatTemplateError",
    "ModelSignals",
    "NotAppendOnly",
    "ParsedTurn",
    "TokenStream",
    "ToolCall",
    "TurnDelta",
    "UnknownChatFormat",
    "detect_family",
    "load_codec",
    "register",
    "registered_names",
    "resolve",
]
