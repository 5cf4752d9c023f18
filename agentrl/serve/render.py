"""Messages and tools -> the exact prompt token ids (the chat template); generated ids -> a reply with tool calls.

The prompt is rendered the way the rollout side renders one (agentrl/rollout/chat.py): the template's text,
tokenized without special tokens added; tools go to the template's `tools=`, or, for a template that does not
render them, into the system message as text (`tools_as_text`). The ids returned are the ids the engine gets.
Message content is tokenized as text: a control string inside it never becomes a turn marker
(agentrl/rollout/content_tokens.py).
"""

from __future__ import annotations

import json
import uuid

from agentrl.env.tool_calls import OPEN, parse_tool_calls
from agentrl.models.chat_format import PROBE_TOOL, tools_as_text
from agentrl.models.content_tokens import ContentError, content_tokenizer
from agentrl.serve.protocol import APIError, ChatMessage


class ChatRenderer:
    def __init__(self, tokenizer):
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template; serve a chat model or set tokenizer.chat_template")
        self.tokenizer = tokenizer
        self.content = content_tokenizer(tokenizer)
        self.stop_ids = stop_token_ids(tokenizer)
        probe = [{"role": "user", "content": "u"}]
        self.renders_tools = PROBE_TOOL["function"]["name"] in self._render(probe, [PROBE_TOOL])

    def _render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )

    def prompt_ids(self, messages: list[ChatMessage], tools: list[dict] | None = None) -> list[int]:
        text, spans = self.rendered([self.plain_message(m) for m in messages], tools)
        return self.content.ids(text, spans)

    def render_text(self, plain: list[dict], tools: list[dict] | None, generation_prompt: bool = True) -> str:
        """The template's text for plain messages (`plain_message`), tools in the template or in the system message."""
        plain, tools = self._tools_placed(plain, tools)
        return self._render_checked(plain, tools, generation_prompt)

    def rendered(
        self, plain: list[dict], tools: list[dict] | None, generation_prompt: bool = True
    ) -> tuple[str, list[tuple[int, int]]]:
        """`render_text`, and the spans in it of the content to tokenize as text (`ContentTokenizer.rendered`)."""
        plain, tools = self._tools_placed(plain, tools)
        try:
            return self.content.rendered(lambda shown: self._render_checked(shown, tools, generation_prompt), plain)
        except ContentError as error:
            raise APIError(str(error), param="messages") from None

    def _tools_placed(self, plain: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
        """The messages and the template's tools: a template that does not render tools gets them as system text."""
        if not tools or self.renders_tools:
            return plain, tools
        listing = tools_as_text(tools)
        plain = list(plain)
        if plain and plain[0]["role"] == "system":
            plain[0] = {**plain[0], "content": f"{plain[0]['content']}\n\n{listing}"}
        else:
            plain.insert(0, {"role": "system", "content": listing})
        return plain, None

    def _render_checked(self, plain: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        try:
            return self._render(plain, tools, generation_prompt)
        except Exception as error:  # the template's own checks (role order, ...) raise jinja errors
            raise APIError(f"the chat template refused these messages: {error}", param="messages") from None

    def plain_message(self, message: ChatMessage) -> dict:
        content = message.content
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if part.get("type", "text") == "text")
        plain = {"role": message.role, "content": content or ""}
        if message.tool_calls:
            calls = [
                {"name": c.function.name, "arguments": _arguments(c.function.arguments)} for c in message.tool_calls
            ]
            if self.renders_tools:
                plain["tool_calls"] = [{"type": "function", "function": call} for call in calls]
            else:  # the model sees its own calls as it wrote them
                plain["content"] += "".join(f"{OPEN}{json.dumps(call)}</tool_call>" for call in calls)
        if message.tool_call_id is not None:
            plain["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            plain["name"] = message.name
        return plain

    def text(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """The tokens that end a reply: the tokenizer's eos (the chat template's end of turn)."""
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token is not None else None
    if eos is None:
        raise ValueError("the tokenizer has no eos token; agentrl serve needs one to end replies")
    return (int(eos),)


def _arguments(arguments: str | dict) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        raise APIError(
            f"a tool call's arguments are not JSON: {arguments[:200]!r}; send them as a JSON object string",
            param="messages",
        ) from None
    return value if isinstance(value, dict) else {"value": value}


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def reply_message(text: str, with_tools: bool) -> tuple[dict, bool]:
    """The assistant message for `text`, and whether it calls tools.

    With tools offered and well-formed Hermes calls in the text, the content is the text before the first
    `<tool_call>` (None when empty) and each call becomes an OpenAI tool call; otherwise the text is the content.
    """
    if with_tools and OPEN in text:
        turn = parse_tool_calls(text)
        if turn.calls and not turn.errors:
            calls = [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
                for call in turn.calls
            ]
            return {"role": "assistant", "content": text[: text.find(OPEN)] or None, "tool_calls": calls}, True
    return {"role": "assistant", "content": text}, False


def streamable_prefix(text: str, stops: tuple[str, ...], with_tools: bool, final: bool) -> str:
    """The part of the text so far a stream may send now: never past a stop string or a tool call, never a tail
    that could still grow into one, nor a half-decoded character. `final`: the text is complete."""
    text, _ = cut_at_stop(text, stops)
    holds = [*stops, OPEN] if with_tools else list(stops)
    if with_tools and OPEN in text:
        text = text[: text.find(OPEN)]
    if final:
        return text
    if text.endswith("\ufffd"):  # a multi-byte character whose last bytes are still to come
        text = text.rstrip("\ufffd")
    keep = len(text)
    for hold in holds:  # the longest tail that is a proper prefix of a stop string or of <tool_call>
        for size in range(min(len(hold) - 1, len(text)), 0, -1):
            if text.endswith(hold[:size]):
                keep = min(keep, len(text) - size)
                break
    return text[:keep]
