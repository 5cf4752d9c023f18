"""What a model's turn holds once parsed: content, reasoning, tool calls and the errors of malformed calls."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str | None = None  # the model's own call id (Mistral writes one); None where the format has none


@dataclass
class ParsedTurn:
    """`content`: the visible text outside reasoning and call markup, surrounding whitespace stripped;
    `reasoning`: the thinking text, stripped likewise; `errors`: one message per malformed call, in words the
    model can act on."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""
    reasoning: str = ""

    @property
    def has_calls(self) -> bool:
        """True when the turn tried to call a tool at all (well-formed or not)."""
        return bool(self.calls or self.errors)


@dataclass(slots=True)
class TurnDelta:
    """What a streamed turn adds: text safe to show now (never part of markup still arriving), and the calls
    (and call errors) completed since the last delta. Joined, the deltas of a turn give its ParsedTurn. Read only
    (not frozen: a frozen dataclass costs three times as much to make, once per streamed token)."""

    content: str = ""
    reasoning: str = ""
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.calls or self.errors)

    def __add__(self, other: TurnDelta) -> TurnDelta:
        return TurnDelta(
            self.content + other.content,
            self.reasoning + other.reasoning,
            self.calls + other.calls,
            self.errors + other.errors,
        )
