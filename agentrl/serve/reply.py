"""One chat choice's generated ids -> the assistant message, as the family's parser reads them: `content`,
`reasoning_content` (vLLM's field) and `tool_calls`, whole or streamed.

Tool calls are parsed only where the request offered tools (tool_choice not none); otherwise, and where a call
did not parse (the turn has errors), the calls stay in the content as the model wrote them. A stream sends the
content and reasoning the family's incremental parser says are safe (never the start of a marker still arriving,
nor of a stop string), and holds everything from the first tool call on: the last chunk carries the rest of the
text and the calls, each whole with its index, so a stream's pieces join to the whole reply exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from agentrl.chat import ChatFamily, ParsedTurn, TokenStream, TurnDelta
from agentrl.chat.scan import Hooks, Scanner
from agentrl.serve.render import ChatRenderer, cut_at_stop, held_tail

RAW = "agentrl_raw"  # Scanner.state key: the text kept as written is inside a call (its opener was written already)


@dataclass
class Reply:
    """The assistant message of one choice, whether it calls tools, and whether a stop string cut it."""

    message: dict
    calls: bool = False
    cut: bool = False
    turn: ParsedTurn = field(default_factory=ParsedTurn)


class ReplyReader:
    """Reads one choice: `read(output_ids)` for the whole reply; for a stream `feed(ids)` for each batch of new
    ids (the delta fields to send), then `last_delta(reply)` with the whole reply."""

    def __init__(
        self,
        renderer: ChatRenderer,
        prompt_ids,
        tools: list[dict] | None,
        with_tools: bool,
        stops: tuple[str, ...] = (),
        parallel_calls: bool = True,
    ):
        self.codec, self.family = renderer.codec, renderer.family
        self.tools, self.with_tools, self.stops, self.parallel_calls = tools, with_tools, stops, parallel_calls
        self.in_reasoning = self.codec.opens_reasoning(prompt_ids)
        self.has_reasoning = self.family.reasoning_key is not None
        self.sent = {"content": "", "reasoning_content": ""}
        self.holding = False
        self.stream: TokenStream | None = None
        self.scanner: Scanner | None = None

    def _scanner(self, calls: bool) -> Scanner:
        scanner = self.family.stream(tools=self.tools, in_reasoning=self.in_reasoning)
        if not calls:
            scanner.hooks = CallsAsText(self.family)
        return scanner

    def _parse(self, text: str, calls: bool) -> ParsedTurn:
        scanner = self._scanner(calls)
        scanner.feed(text)
        return scanner.finish()[1]

    # ---- the whole reply ----------------------------------------------------------------------------------

    def read(self, output_ids) -> Reply:
        text, cut = cut_at_stop(self.codec.turn_text(output_ids), self.stops)
        turn = self._parse(text, calls=self.with_tools)
        if turn.errors:  # a call that does not parse: the whole text stays the content, as the model wrote it
            turn = self._parse(text, calls=False)
        calls = turn.calls if self.parallel_calls else turn.calls[:1]
        message: dict = {"role": "assistant", "content": turn.content if turn.content or not calls else None}
        if self.has_reasoning:
            message["reasoning_content"] = turn.reasoning or None
        if calls:
            ids = self.family.call_ids(ParsedTurn(calls=calls))
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
                }
                for call_id, call in zip(ids, calls, strict=True)
            ]
        return Reply(message, bool(calls), cut, turn)

    # ---- streaming ----------------------------------------------------------------------------------------

    def feed(self, ids) -> dict:
        """The delta fields (`content`, `reasoning_content`) the ids just generated make safe to send."""
        if self.stream is None:
            self.scanner = self._scanner(self.with_tools)
            self.stream = TokenStream(self.codec, StopCut(self.scanner, self.stops))
        delta = self.stream.feed(ids)
        if self.holding:
            return {}
        if self.with_tools and (delta.calls or delta.errors or self._in_call()):
            self.holding = True  # the rest comes with the calls, once the turn is whole
            return {}
        out = {}
        for key, piece in (("reasoning_content", delta.reasoning), ("content", delta.content)):
            if piece:
                out[key] = piece
                self.sent[key] += piece
        return out

    def _in_call(self) -> bool:
        """Whether the parser is inside a tool call's markup (a capture mode past the turn's first)."""
        scanner = self.scanner
        return scanner.modes[scanner.mode].channel is None and scanner.mode != self.family.start

    def last_delta(self, reply: Reply) -> dict:
        """What the stream has not sent of the whole reply: the rest of its text, and its tool calls."""
        delta = {}
        for key in ("reasoning_content", "content"):
            whole, sent = reply.message.get(key) or "", self.sent[key]
            if len(whole) > len(sent) and whole.startswith(sent):
                delta[key] = whole[len(sent) :]
        if reply.calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(reply.message["tool_calls"])]
        return delta


class StopCut:
    """A scanner behind a stop-string guard: text past the first stop string never reaches it, and a tail that
    may still grow into one waits for the next piece. The Scanner's `feed` / `finish`, for TokenStream."""

    def __init__(self, scanner: Scanner, stops: tuple[str, ...]):
        self.scanner, self.stops = scanner, stops
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> TurnDelta:
        if self.stopped:
            return TurnDelta()
        if not self.stops:
            return self.scanner.feed(text)
        text, self.stopped = cut_at_stop(self.held + text, self.stops)
        keep = len(text) if self.stopped else len(text) - held_tail(text, self.stops)
        self.held = text[keep:]
        return self.scanner.feed(text[:keep]) if keep else TurnDelta()

    def lane(self):
        """The scanner's lane (`Scanner.lane`) where no stop string is watched for."""
        return None if self.stops else self.scanner.lane()

    def finish(self) -> tuple[TurnDelta, ParsedTurn]:
        first = self.scanner.feed(self.held) if self.held else TurnDelta()
        self.held = ""
        last, turn = self.scanner.finish()
        return first + last, turn


class CallsAsText(Hooks):
    """A family's parse with its tool calls kept in the content as the model wrote them (markers included): for a
    turn whose request offered no tools, and for one whose calls did not parse. A family whose turn starts with a
    structural header (harmony) still reads its headers; a call's body then goes to the content."""

    def __init__(self, family: ChatFamily):
        self.family = family

    def _header(self, scanner: Scanner, mode: str) -> bool:
        return mode == self.family.start and scanner.modes[mode].channel is None

    def close(self, scanner: Scanner, mode: str, body: str, marker: str) -> str | None:
        if self._header(scanner, mode):
            following = self.family.close(scanner, mode, body, marker)
            if following is not None and scanner.modes[following].channel is None:
                return _text_twin(scanner, following)
            return following
        following = scanner.modes[mode].exits[marker]
        written = ("" if scanner.state.get(RAW) else scanner.opened_with) + body + marker
        scanner.state[RAW] = scanner.modes[following].channel is None
        scanner.text("content", written)
        return None

    def unfinished(self, scanner: Scanner, mode: str, opened_with: str, body: str) -> None:
        if self._header(scanner, mode):
            return  # a header cut short: markup, no text of the turn
        scanner.text("content", ("" if scanner.state.get(RAW) else opened_with) + body)


def _text_twin(scanner: Scanner, capture: str) -> str:
    """The content mode that ends where capture mode `capture` ends (harmony: a call's body read as a final
    message's)."""
    exits = scanner.modes[capture].exits
    for name, mode in scanner.modes.items():
        if mode.channel == "content" and mode.exits == exits:
            return name
    raise ValueError(f"the chat format has no content mode ending as its {capture!r} mode does")
