"""A chat format family: how its turns parse (whole or streamed), which tokens end a turn, how it is detected, and
the assistant message its chat template takes back."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import ClassVar

from agentrl.chat.scan import Hooks, Mode, Scanner
from agentrl.chat.turn import ParsedTurn, ToolCall


@dataclass(frozen=True)
class ModelSignals:
    """What detection looks at in a model folder: the tokenizer's added tokens, its chat template's text, and the
    config's model_type."""

    tokens: frozenset[str]
    template: str = ""
    model_type: str | None = None

    @classmethod
    def of(cls, tokenizer, model_type: str | None = None) -> ModelSignals:
        template = tokenizer.chat_template
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default") or next(iter(template.values()), "")
        tokens = set(tokenizer.get_added_vocab()) | set(getattr(tokenizer, "all_special_tokens", ()))
        return cls(frozenset(tokens), template or "", model_type)


class ChatFamily(Hooks):
    """Subclasses set the class attributes and the scanner modes, and implement `call` (one call body -> a
    ToolCall, or an error message) where they have capture modes.

    `end_of_turn`: the tokens that end a generated turn (the engine's stop tokens); `closers`: the text the chat
    template writes at the end of an assistant message (empty where the next message's own marker ends it, as in
    GLM, whose stop tokens are `<|observation|>` and `<|user|>`); `reasoning_key`: where the template reads an
    assistant message's reasoning; `reasoning_open` / `reasoning_close`: the markers around reasoning (a prompt
    that ends with the opener starts the turn inside reasoning, one whose generation prompt closes it has thinking
    off); `arguments_as_text`: the template concatenates a call's arguments as JSON
    text (DeepSeek) instead of taking a mapping.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    end_of_turn: ClassVar[tuple[str, ...]] = ()
    closers: ClassVar[tuple[str, ...]] = ()
    reasoning_key: ClassVar[str | None] = None
    reasoning_open: ClassVar[str | None] = None
    reasoning_close: ClassVar[str | None] = None
    arguments_as_text: ClassVar[bool] = False
    markup_ends: ClassVar[tuple[str, ...]] = ()  # end-of-turn tokens that are markup the parse needs (kept in text)
    modes: ClassVar[dict[str, Mode]] = {}
    start: ClassVar[str] = "content"
    reasoning_start: ClassVar[str | None] = None  # the mode a turn starts in when its prompt opened reasoning

    @classmethod
    def detect(cls, signals: ModelSignals) -> int:
        """How surely a model with these signals uses this family: 0 not at all, 100 its own special tokens."""
        return 0

    # ---- parsing -------------------------------------------------------------------------------

    def stream(self, *, tools: list[dict] | None = None, in_reasoning: bool = False) -> Scanner:
        """A streaming parser for one turn: `feed(text)` -> TurnDelta, then `finish()` -> (TurnDelta, ParsedTurn).
        `tools`: the tools offered (families whose arguments are untyped text read their types); `in_reasoning`:
        the prompt ended inside a reasoning block (`reasoning_open`)."""
        start = self.reasoning_start if in_reasoning and self.reasoning_start else self.start
        return Scanner(self.modes, start, self, tools)

    def parse(self, text: str, *, tools: list[dict] | None = None, in_reasoning: bool = False) -> ParsedTurn:
        """The whole turn's text (special tokens kept, the end-of-turn token dropped) -> its ParsedTurn."""
        scanner = self.stream(tools=tools, in_reasoning=in_reasoning)
        scanner.feed(text)
        return scanner.finish()[1]

    def turn_stop(self, next_role: str | None) -> str | None:
        """The stop token a model writes after a turn that the template does not write (GLM's next role), given the
        role of the message that follows (None: none does); None where the template writes the turn's end."""
        return None

    # ---- messages for the chat template ---------------------------------------------------------

    def new_call_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def valid_call_id(self, call_id: str | None) -> bool:
        return bool(call_id)

    def call_ids(self, turn: ParsedTurn) -> list[str]:
        """An id for each call of `turn`: the model's own where the template accepts it, else a new one."""
        return [call.id if self.valid_call_id(call.id) else self.new_call_id() for call in turn.calls]

    def assistant_message(self, turn: ParsedTurn, call_ids: list[str] | None = None) -> dict:
        """`turn` as the assistant message this family's template renders back (Hugging Face message format)."""
        message: dict = {"role": "assistant", "content": turn.content}
        if turn.reasoning and self.reasoning_key:
            message[self.reasoning_key] = turn.reasoning
        if turn.calls:
            ids = call_ids or self.call_ids(turn)
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": self._function(call)}
                for call_id, call in zip(ids, turn.calls, strict=True)
            ]
        return message

    def _function(self, call: ToolCall) -> dict:
        arguments = json.dumps(call.arguments, ensure_ascii=False) if self.arguments_as_text else call.arguments
        return {"name": call.name, "arguments": arguments}

    def tool_message(self, call_id: str, name: str, content: str) -> dict:
        """A tool's result as the message that follows the assistant's call."""
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def decide_content(_text: str) -> str:
    """A `Mode.decide` for turns that start with optional markup, then content."""
    return "content"
