"""Prompts that reuse a session's own tokens: nothing the model generated is re-tokenized.

An agent sends its whole history with every call. When a request repeats an earlier call's messages
and that call's reply, then adds messages (tool results, the user's next turn), its prompt is that
call's prompt ids, the ids the engine generated (closed with the end-of-turn token where a length
limit cut them), then the template's tokens for the new messages alone, found by rendering the
template with and without them (as the env route's chat format does). The call then extends the last
one token for token and both train as one sample (agentrl/gateway/trace.py). Any other request (a
rewritten history, a sub-agent's) is rendered from scratch and starts a sample of its own. The new
messages' content is tokenized as text (agentrl/rollout/content_tokens.py): a control string in a
tool result is never a turn marker.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass


@dataclass
class _Turn:
    messages: list[dict]  # the request's messages, as the template saw them
    tools_key: str
    prompt_ids: list[int]
    closed_output: list[int]  # the generated ids, ending with the end-of-turn token
    reply: dict  # the assistant message the client was shown, as it sends it back


class PromptStitcher:
    def __init__(self, renderer):
        self.renderer = renderer  # agentrl.serve.render.ChatRenderer
        self.tokenizer = renderer.tokenizer
        self.eos_text = self.tokenizer.eos_token
        self.turns: list[_Turn] = []
        self.stitched = 0

    def prompt_ids(self, messages, tools) -> list[int]:
        plain = [self.renderer.plain_message(m) for m in messages]
        key = _tools_key(tools)
        for turn in reversed(self.turns):
            n = len(turn.messages)
            if turn.tools_key != key or len(plain) <= n + 1 or plain[:n] != turn.messages:
                continue
            if not same_reply(_as_dict(messages[n]), turn.reply):
                continue
            suffix = self._suffix_ids(plain, n, tools)
            if suffix is not None:
                self.stitched += 1
                return turn.prompt_ids + turn.closed_output + suffix
        return self.renderer.prompt_ids(messages, tools)

    def _suffix_ids(self, plain: list[dict], n: int, tools) -> list[int] | None:
        """The template's tokens after the assistant message at `n` (its end-of-turn token excluded)."""
        full, spans = self.renderer.rendered(plain, tools, generation_prompt=True)
        head = self.renderer.render_text(plain[: n + 1], tools, generation_prompt=False)
        end = head.rfind(self.eos_text)
        if end < 0:
            return None
        cut = end + len(self.eos_text)
        if not full.startswith(head[:cut]):
            return None
        return self.renderer.content.ids(full, spans, start=cut)

    def remember(self, record, shown_tools, text: str, reply: dict) -> None:
        """After a chat call: its messages, the tools its prompt showed, its prompt and output, and the reply's text
        and message as the client saw them."""
        request = getattr(record, "request", None)
        if record.endpoint != "chat.completions" or request is None:
            return
        if request.stop_strings() and text != _cut(text, request.stop_strings()):
            return  # the client saw less than the model wrote: its history cannot extend these tokens
        output, stop_ids = list(record.output_ids), self.renderer.stop_ids
        closed = output if output and output[-1] in stop_ids else [*output, stop_ids[0]]
        messages = [self.renderer.plain_message(m) for m in request.messages]
        self.turns.append(_Turn(messages, _tools_key(shown_tools), list(record.prompt_ids), closed, reply))


def same_reply(sent: dict, reply: dict) -> bool:
    """The assistant message a client sends back is the reply it got: the same text and the same calls
    (call ids aside; arguments compared as JSON values)."""
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


def _cut(text: str, stops) -> str:
    from agentrl.serve.render import cut_at_stop

    return cut_at_stop(text, tuple(stops))[0]
