"""Prompts that reuse a session's own tokens: nothing the model generated is re-tokenized.

An agent sends its whole history with every call. When a request repeats an earlier call's messages
and that call's reply (its content and tool calls; the reasoning a client sends back or drops aside), then adds
messages (tool results, the user's next turn), its prompt is that call's prompt ids, the ids the engine
generated (closed with the template's end of turn where a length limit cut them), then the template's tokens for
the new messages alone, as the family's codec finds them (`ChatCodec.continuation_start`: GLM's stop token,
the next role, is not repeated). The call then extends the last one token for token and both train as one sample
(agentrl/gateway/trace.py). Where the template renders the history differently once the new messages follow
(it drops earlier reasoning, rewrites an end token: docs/chat-formats.md), chat.rewritten decides, as in the env
loop: `keep` stitches all the same (the model's tokens as it generated them, then the template's tokens for the new
messages), `new_sample` renders the prompt from scratch and starts a sample of its own. Any other request (a
rewritten history, a sub-agent's) is rendered from scratch and starts a sample of its own. The new messages'
content is tokenized as text (agentrl/models/content_tokens.py): a control string in a tool result is never a
turn marker.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from agentrl.chat import NotAppendOnly
from agentrl.models.chat_format import REWRITTEN


@dataclass
class _Turn:
    messages: list[dict]  # the request's messages, as the template saw them
    tools_key: str
    prompt_ids: list[int]
    output_ids: list[int]  # every generated id, the stop id included where one ended the turn
    ended: bool  # a stop id ended the turn (else the length limit cut it)
    reply: dict  # the assistant message the client was shown, as it sends it back


class PromptStitcher:
    """One session's prompts: `renderer` (agentrl.serve.render.ChatRenderer) renders; `rewritten` is chat.rewritten,
    what a request that extends an earlier reply the template renders differently gets (`keep`: stitched all the
    same; `new_sample`: rendered from scratch)."""

    def __init__(self, renderer, rewritten: str = "keep"):
        if rewritten not in REWRITTEN:
            raise ValueError(f"rewritten must be one of {', '.join(REWRITTEN)}, got {rewritten!r}")
        self.renderer = renderer
        self.codec = renderer.codec
        self.tokenizer = renderer.tokenizer
        self.keep_rewritten = rewritten == "keep"
        self.turns: list[_Turn] = []
        self.stitched = 0
        self.rewritten = 0  # requests that extended an earlier reply the template then renders differently

    def prompt_ids(self, messages, tools) -> list[int]:
        plain = [self.renderer.plain_message(m) for m in messages]
        key = _tools_key(tools)
        rewritten = False
        for turn in reversed(self.turns):
            n = len(turn.messages)
            if turn.tools_key != key or len(plain) <= n + 1 or plain[:n] != turn.messages:
                continue
            if not same_reply(_as_dict(messages[n]), turn.reply):
                continue
            try:
                suffix = self._suffix_ids(plain, n, tools, turn)
            except NotAppendOnly:
                rewritten = True
                if not self.keep_rewritten:
                    continue
                suffix = self._suffix_ids(plain, n, tools, turn, keep_rewritten=True)
            if suffix is not None:
                self.stitched += 1
                self.rewritten += rewritten
                return turn.prompt_ids + self._closed(turn, plain[: n + 1], tools) + suffix
        self.rewritten += rewritten
        return self.renderer.prompt_ids(messages, tools)

    def _closed(self, turn: _Turn, history: list[dict], tools) -> list[int]:
        """The turn's generated ids, closed as the template closes an assistant message where the length limit
        cut them (nothing for a family whose next message's role ends a turn)."""
        if turn.ended:
            return turn.output_ids
        placed, placed_tools = self.renderer.tools_placed(history, tools)
        return turn.output_ids + self.codec.closing_ids(placed, placed_tools)

    def _suffix_ids(
        self, plain: list[dict], n: int, tools, turn: _Turn, keep_rewritten: bool = False
    ) -> list[int] | None:
        """The template's tokens after the assistant message at `n`; NotAppendOnly where the template renders the
        history differently once the new messages follow, unless `keep_rewritten` (chat.rewritten=keep)."""
        full, spans = self.renderer.rendered(plain, tools, generation_prompt=True)
        placed, placed_tools = self.renderer.tools_placed(plain, tools)
        at = n + 1 + len(placed) - len(plain)  # after the turn, past a system message the tools listing added
        ended_with = turn.output_ids[-1] if turn.ended else None
        text, start = self.codec.continuation_start(placed[:at], placed[at:], placed_tools, ended_with, keep_rewritten)
        if text != full:
            return None
        return self.renderer.content.ids(full, spans, start=start)

    def remember(self, record) -> None:
        """After a chat call: its messages, the tools its prompt showed, its prompt and output, and the reply as
        the client saw it."""
        request = getattr(record, "request", None)
        if record.endpoint != "chat.completions" or request is None or record.reply is None:
            return
        if record.cut:
            return  # a stop string cut the reply: the client saw less than the model wrote
        output = list(record.output_ids)
        ended = bool(output) and output[-1] in self.renderer.stop_ids
        messages = [self.renderer.plain_message(m) for m in request.messages]
        turn = _Turn(messages, _tools_key(record.shown_tools), list(record.prompt_ids), output, ended, record.reply)
        self.turns.append(turn)


def same_reply(sent: dict, reply: dict) -> bool:
    """The assistant message a client sends back is the reply it got: the same text and the same calls
    (call ids aside; arguments compared as JSON values; reasoning aside: the model's own tokens are kept)."""
    if sent.get("role") != "assistant" or (sent.get("content") or "") != (reply.get("content") or ""):
        return False
    return _calls(sent) == _calls(reply)


def _calls(message: dict) -> list[tuple[str, object]]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        calls.append((function.get("name"), arguments))
    return calls


def _as_dict(message) -> dict:
    return message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)


def _tools_key(tools) -> str:
    return json.dumps(tools or [], sort_keys=True, default=str)
