"""An incremental scanner that splits a turn's text into content, reasoning and tool-call bodies by marker strings.

A family describes its markup as modes (`Mode`): a text mode sends its text to the content or the reasoning
channel, a capture mode (channel None) gathers a call body until one of its exit markers; each mode leaves for
another at an exit marker. Text is fed in pieces of any size: a tail that could still grow into a marker is
held back until the next piece (or the end) decides it, so feeding a turn one character at a time gives what
feeding it whole gives. Each piece is searched once (a capture mode resumes its search where it left off), so a
turn costs time linear in its length however it is cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrl.chat.turn import ParsedTurn, ToolCall, TurnDelta

PLAIN_KEPT = 65536  # pieces whose markers each mode remembers (a vocabulary's common ones), shared by every stream


@dataclass(frozen=True)
class Mode:
    """`channel`: "content" or "reasoning" for a text mode, None for a capture mode; `exits`: marker -> next mode;
    `decide`: for a mode the turn starts in, the mode to move to once text that is not whitespace comes before any
    exit marker (given that text, leading whitespace stripped; None: it cannot tell yet, and at the end of the turn
    that means "content"); `separate`: entering this text mode after text of the same channel puts a newline
    between them (a new message of that channel)."""

    channel: str | None
    exits: dict[str, str] = field(default_factory=dict)
    decide: Callable[[str], str | None] | None = None
    separate: bool = False
    # for the hot path: text can hold (the start of) a marker only where one of the markers' first characters is
    # in it (`marker_start(text, pos)` finds one), and a held tail is at most `reach` characters long
    marker_start: Callable = field(init=False, repr=False, compare=False)
    reach: int = field(init=False, repr=False, compare=False)
    # text -> whether no marker starts in it (a vocabulary's pieces recur: looked up instead of searched)
    plain: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        firsts = sorted({marker[0] for marker in self.exits})
        pattern = re.compile("[" + "".join(re.escape(first) for first in firsts) + "]") if firsts else None
        object.__setattr__(self, "marker_start", pattern.search if pattern else lambda *_: None)
        object.__setattr__(self, "reach", max((len(marker) for marker in self.exits), default=1) - 1)
        object.__setattr__(self, "plain", {})


class TextSink:
    """One channel's text, stripped of surrounding whitespace as it streams: leading whitespace is dropped and a
    whitespace run is held until text follows it, so the pieces sent join to the stripped whole."""

    def __init__(self):
        self.parts: list[str] = []
        self.held = ""
        self.started = False

    def add(self, text: str) -> str:
        """Take `text`; return what may be sent now."""
        text = self.held + text
        if not self.started:
            text = text.lstrip()
        body = text.rstrip()
        self.held = text[len(body) :]
        if body:
            self.started = True
            self.parts.append(body)
        return body

    def separate(self) -> None:
        if self.started and not self.held:
            self.held = "\n"

    def text(self) -> str:
        return "".join(self.parts)


class Hooks:
    """What a family does at the edges of its capture modes; the default treats a capture as a call body that the
    family's `call` parses."""

    def close(self, scanner: Scanner, mode: str, body: str, marker: str) -> str | None:
        """A capture mode ended at `marker`: parse `body`; return the next mode, or None for the exit's own."""
        scanner.add_call(self.call(scanner, mode, body))
        return None

    def call(self, scanner: Scanner, mode: str, body: str) -> ToolCall | str:
        raise NotImplementedError

    def unfinished(self, scanner: Scanner, mode: str, opened_with: str, body: str) -> None:
        """The turn ended inside a capture mode: the text stays content (nothing is lost) and an error says so."""
        closers = " or ".join(scanner.modes[mode].exits) or "its end marker"
        scanner.text("content", opened_with + body)
        scanner.add_call(f"a tool call opened with {opened_with} was not closed with {closers} (the turn ended first)")


class Scanner:
    """Feed a turn's text in pieces (`feed`), then `finish`; each returns the TurnDelta it completed."""

    def __init__(self, modes: dict[str, Mode], start: str, hooks: Hooks, tools: list[dict] | None = None):
        self.modes, self.mode, self.hooks, self.tools = modes, start, hooks, tools
        self.sinks = {"content": TextSink(), "reasoning": TextSink()}
        self.calls: list[ToolCall] = []
        self.errors: list[str] = []
        self.buffer = ""
        self.searched = 0  # buffer[:searched] holds no exit marker of the current capture mode
        # a capture mode's body pieces in which no marker can start, after a fully searched buffer (joined to it
        # when the scanner next has to look: one join instead of a string concatenation per streamed token)
        self.body: list[str] = []
        self.opened_with = ""  # the marker that entered the current mode
        self.last_channel: str | None = None
        self.state: dict = {}  # what a family's hooks keep between modes (harmony: the message's recipient)
        self.new_text = {"content": "", "reasoning": ""}  # the text sent since the last delta, by channel
        self.new_calls: list[ToolCall] = []
        self.new_errors: list[str] = []
        self.done = False

    # ---- what hooks call --------------------------------------------------------------------

    def text(self, channel: str, text: str) -> None:
        sent = self.sinks[channel].add(text)
        if sent:
            self.new_text[channel] += sent
            self.last_channel = channel

    def add_call(self, call: ToolCall | str) -> None:
        if isinstance(call, ToolCall):
            self.calls.append(call)
            self.new_calls.append(call)
        else:
            self.errors.append(call)
            self.new_errors.append(call)

    # ---- feeding ----------------------------------------------------------------------------

    def lane(self) -> tuple[Mode, list[str]] | None:
        """Where the next piece goes if no exit marker of the current mode can start in it (and, in a text mode, it
        does not end in whitespace): the mode and the list the piece is appended to, with nothing else to do and
        an empty delta, or the piece itself as the delta of the mode's channel. A text mode's text going on where
        it left off (nothing held) appends to its channel's parts; a capture mode searched to its end, to its body.
        None where the next piece needs `feed`. Valid until the next `feed` or `finish` (TokenStream's fast path
        for ids whose text is known)."""
        if self.done:
            return None
        mode = self.modes[self.mode]
        if mode.decide is not None:
            return None
        channel = mode.channel
        if channel is None:
            return (mode, self.body) if self.searched == len(self.buffer) else None
        sink = self.sinks.get(channel)
        if self.buffer or sink is None or not sink.started or sink.held or self.last_channel != channel:
            return None
        return mode, sink.parts

    def _join_body(self) -> None:
        self.buffer += "".join(self.body)
        self.searched = len(self.buffer)  # the body's pieces hold no marker's first character
        self.body.clear()

    def feed(self, text: str) -> TurnDelta:
        if self.done:
            raise RuntimeError("feed() after finish(); start a new stream for the next turn")
        mode = self.modes[self.mode]
        if mode.decide is None and (not self.buffer or (mode.channel is None and self.searched == len(self.buffer))):
            plain = mode.plain.get(text)  # a streamed token's text recurs: whether a marker may start in it, kept
            if plain is None:
                plain = not mode.marker_start(text)
                if len(mode.plain) < PLAIN_KEPT:
                    mode.plain[text] = plain
            if plain:
                channel = mode.channel
                if channel is None:  # a capture mode's body goes on (nothing held that may grow into a marker)
                    self.body.append(text)
                    return TurnDelta()
                sink = self.sinks.get(channel)
                # the common case of a streamed token: text going on where its channel's text left off (nothing is
                # pending between feeds: each ends by taking what it completed)
                if sink is not None and sink.started and not sink.held and self.last_channel == channel:  # noqa: SIM102
                    if not text[-1:].isspace() and not (self.new_calls or self.new_errors):
                        sink.parts.append(text)
                        return TurnDelta(text) if channel == "content" else TurnDelta("", text)
                return self._plain(channel, text)
        if self.body:
            self._join_body()
        self.buffer += text
        self._run(final=False)
        return self._take()

    def _plain(self, channel: str, text: str) -> TurnDelta:
        """`text`, in which no exit marker of the current text mode starts, with nothing held before it."""
        self.text(channel, text)
        return self._take()

    def finish(self) -> tuple[TurnDelta, ParsedTurn]:
        """The last delta and the whole turn."""
        if not self.done:
            if self.body:
                self._join_body()
            self._run(final=True)
            mode = self.modes[self.mode]
            if mode.channel is None:
                self.hooks.unfinished(self, self.mode, self.opened_with, self.buffer)
            elif self.buffer:
                self.text(mode.channel, self.buffer)
            self.buffer, self.done = "", True
        turn = ParsedTurn(
            calls=list(self.calls),
            errors=list(self.errors),
            content=self.sinks["content"].text(),
            reasoning=self.sinks["reasoning"].text(),
        )
        return self._take(), turn

    def _take(self) -> TurnDelta:
        new = self.new_text
        if self.new_calls or self.new_errors:
            delta = TurnDelta(new["content"], new["reasoning"], tuple(self.new_calls), tuple(self.new_errors))
            self.new_calls, self.new_errors = [], []
        else:
            delta = TurnDelta(new["content"], new["reasoning"])
        new["content"] = new["reasoning"] = ""
        return delta

    def _run(self, final: bool) -> None:
        while self.buffer:
            mode = self.modes[self.mode]
            found = _first_marker(self.buffer, mode.exits, self.searched)
            end = found[0] if found else len(self.buffer) - (0 if final else _held_tail(self.buffer, mode))
            if mode.decide is not None:
                before = self.buffer[:end]
                if before.strip():
                    choice = mode.decide(before.lstrip())
                    if choice is None and not final:
                        return  # the text so far does not tell yet: wait for more
                    self._enter(choice or "content", "")
                    continue
                self.buffer = self.buffer[end:]  # leading whitespace: no channel has started
                found = (0, found[1]) if found else None
                end = 0
            if found is None:
                if mode.channel is not None:
                    if end:
                        self.text(mode.channel, self.buffer[:end])
                        self.buffer = self.buffer[end:]
                else:
                    self.searched = end
                return
            start, marker = found
            body, self.buffer = self.buffer[:start], self.buffer[start + len(marker) :]
            following = mode.exits[marker]
            if mode.channel is not None:
                if body:
                    self.text(mode.channel, body)
            else:
                following = self.hooks.close(self, self.mode, body, marker) or following
            self._enter(following, marker)

    def _enter(self, name: str, marker: str) -> None:
        self.mode, self.opened_with, self.searched = name, marker, 0
        mode = self.modes[name]
        if mode.separate and mode.channel is not None and self.last_channel == mode.channel:
            self.sinks[mode.channel].separate()


def _first_marker(text: str, markers: dict[str, str], start: int) -> tuple[int, str] | None:
    """(position, marker) of the earliest exit marker in text[start:]; the longer one where two start together."""
    best = None
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (best is None or at < best[0] or (at == best[0] and len(marker) > len(best[1]))):
            best = (at, marker)
    return best


def _held_tail(text: str, mode: Mode) -> int:
    """The length of the longest tail of `text` that is a proper prefix of an exit marker (it may still become one)."""
    if not mode.reach or not mode.marker_start(text, len(text) - mode.reach):
        return 0
    longest = 0
    for marker in mode.exits:
        first = marker[0]
        at = text.find(first, max(0, len(text) - len(marker) + 1))
        while at >= 0:
            size = len(text) - at
            if size > longest and marker.startswith(text[at:]):
                longest = size
                break
            at = text.find(first, at + 1)
    return longest
