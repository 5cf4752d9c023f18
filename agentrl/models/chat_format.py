"""Token ids for a conversation built turn by turn, never re-tokenized, in the model's chat format (agentrl/chat/).

The prompt is tokenized once through the chat template. After that, generated tokens are appended exactly as the
engine produced them, and the messages that follow a turn (one `tool` message per call result, or one `user`
message) contribute only the template's ids after the turn (`ChatCodec.continuation_ids`). Where the template is
append-only for that kind of message, the template's text around each message's content is found once per shape
(the roles, tool names and call ids of the new messages) and reused: microseconds a turn instead of rendering the
conversation (a millisecond or two).

Tools (JSON-schema function specs from the env's reset) go to the template's `tools=` argument. A template that
ignores tools (like the tiny test model's) gets a plain-text tool list in the system message instead, with the call
format the family writes, so small models still see them.

Every message's content (the system prompt and tools text, a dataset's context, each observation) is tokenized as
text: a control string such as `<|im_end|>` inside it is its characters' tokens, never a turn marker
(agentrl/models/content_tokens.py).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from agentrl.chat.codec import ChatCodec, NotAppendOnly, TokenStream, load_codec
from agentrl.chat.hermes import HermesFamily
from agentrl.chat.turn import ParsedTurn, ToolCall
from agentrl.models.content_tokens import content_tokenizer, spans_without

PLACEHOLDER = "\u2591agentrl\u2591"
# Prompts and observations kept by their text (their ids as int32 arrays: 8 MB for 1024 prompts of 2,000 tokens): a
# group's episodes share one prompt, a dataset repeats rows, a game repeats its replies, and rendering one through the
# template costs ~100 us. A full cache is emptied and fills again.
CACHED_TEXTS = 1024
# Turns of up to this many ids keep their decoded text (up to CACHED_TEXTS of them): short answers repeat, and the
# tokenizer's decode costs tens of microseconds.
CACHED_TURN_IDS = 16
PROBE_TOOL = {
    "type": "function",
    "function": {"name": "agentrl_probe_tool", "description": "", "parameters": {"type": "object", "properties": {}}},
}
# Content that a template writing content verbatim keeps verbatim, and one escaping it (`| tojson`) does not: a new
# message shape's text split is trusted only if it renders this content as it is.
AWKWARD_CONTENT = "agentrl \"quoted\" \\ back\nslash \u00e9 {brace} <a href='x'>&amp;</a>\t"
EXAMPLE_CALL = ToolCall("tool_name", {"argument": "value"})
REWRITTEN = ("keep", "new_sample")
ID = "tool_call_id"


class ChatFormat:
    """The env agent loop's chat format: `codec` (agentrl.chat.ChatCodec) renders and parses; `system_prompt` is
    env.system_prompt; `rewritten`: what a turn that the template rewrites once more messages follow becomes
    (chat.rewritten: `keep` the generated ids, or `new_sample`: `continuation_ids` raises NotAppendOnly for the loop
    to start one)."""

    def __init__(
        self,
        tokenizer,
        system_prompt: str | None = None,
        *,
        chat_format: str | None = None,
        template_kwargs: dict | None = None,
        rewritten: str = "keep",
        model_type: str | None = None,
        codec: ChatCodec | None = None,
    ):
        if rewritten not in REWRITTEN:
            raise ValueError(f"rewritten must be one of {', '.join(REWRITTEN)}, got {rewritten!r}")
        self.codec = codec or load_codec(tokenizer, chat_format, template_kwargs, model_type)
        self.family = self.codec.family
        self.tokenizer = tokenizer
        self.content = content_tokenizer(tokenizer)
        self.system_prompt = system_prompt
        self.keep_rewritten = rewritten == "keep"
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        # A turn ends where the template ends one: the family's end tokens, never the padding token (Qwen's
        # <|endoftext|>), which a model that writes it mid-turn has left its format anyway.
        pad = tokenizer.pad_token_id
        self.stop_ids = tuple(i for i in self.codec.stop_ids if i != pad or i == self.eos_id)
        self.probe = self.codec.probe()
        self.template_renders_tools = self.probe.renders_tools
        self.text_fields = ("content", self.family.reasoning_key) if self.family.reasoning_key else ("content",)
        # Where the family's markup is special tokens (harmony, Llama's <|python_tag|>, DeepSeek, Mistral), a turn's
        # text keeps special tokens; where it is plain text (Hermes, Qwen3, GLM-4.5), special tokens are left out as
        # they always were (a model that writes <|im_start|> mid-turn).
        specials = {token for token in self.content.special_ids}
        markup = {marker for mode in self.family.modes.values() for marker in mode.exits}
        markup |= {m for m in (self.family.reasoning_open, self.family.reasoning_close) if m}
        markup_ids = {self.tokenizer.convert_tokens_to_ids(m) for m in markup if m in tokenizer.get_vocab()}
        self.markup_is_special = bool(markup_ids & specials)
        self._single_closer = self._closing_constant()
        self._call_format: str | None = None
        self._observation_split: tuple[str, str] | None = None
        self._prompts: dict[tuple, array] = {}
        self._observations: dict[str, array] = {}
        self._turn_texts: dict[tuple, str] = {}  # short turns' texts by their ids (a one-token game repeats them)
        self._splits: dict[tuple, Split | None] = {}  # message shape -> the template's text around contents

    # ---- the prompt -------------------------------------------------------------------------------------------

    def _head(self, tools_text: str = "", system_prompt: str | None = None) -> list[dict]:
        system = "\n\n".join(part for part in (system_prompt or self.system_prompt, tools_text) if part)
        return [{"role": "system", "content": system}] if system else []

    def prompt_messages(self, first_observation: str, context: list[dict] = ()) -> list[dict]:
        """The first prompt as chat messages (tools aside): the system message, `context` (messages a dataset
        row puts before its question; a system message there replaces env.system_prompt), the observation."""
        context = list(context)
        system = context.pop(0)["content"] if context and context[0].get("role") == "system" else None
        return [*self._head(system_prompt=system), *context, {"role": "user", "content": first_observation}]

    def prompt_ids(
        self, first_observation: str, tools: list[dict] | None = None, context: list[dict] = ()
    ) -> list[int]:
        """The first prompt: system message, tools, `context` and the env's first observation, with the generation
        prompt."""
        key = _prompt_key(first_observation, tools, context)
        ids = self._prompts.get(key) if key is not None else None
        if ids is None:
            ids = array("i", self._render_prompt(first_observation, tools, context))
            if key is not None:
                _remember(self._prompts, key, ids)
        return list(ids)

    def _render_prompt(self, first_observation: str, tools: list[dict] | None, context: list[dict]) -> list[int]:
        messages = self.prompt_messages(first_observation, context)
        listed = bool(tools) and not self.template_renders_tools
        messages, tools = self.tools_placed(messages, tools)
        text, spans = self.content.rendered(lambda shown: self.codec.render(shown, tools, True), messages)
        if listed and spans and not isinstance(self.family, HermesFamily):
            spans = spans_without(spans, text, self._call_line())
        return self.content.ids(text, spans)

    def tools_placed(self, messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
        """The messages and the template's tools: a template that does not render tools gets them as system text."""
        if not tools or self.template_renders_tools:
            return messages, tools
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        rest = messages[1:] if system is not None else messages
        return [*self._head(self.tools_text(tools), system), *rest], None

    def tools_text(self, tools: list[dict]) -> str:
        """The tools as system text (`tools_as_text`), with the call format the family writes."""
        listing = tools_as_text(tools)
        if isinstance(self.family, HermesFamily):  # tools_as_text's own call format is Hermes'
            return listing
        return listing.replace(tools_as_text([]).splitlines()[1], self._call_line())

    def _call_line(self) -> str:
        if self._call_format is None:
            self._call_format = call_format(self.codec)
        return self._call_format

    # ---- a turn -----------------------------------------------------------------------------------------------

    def opens_reasoning(self, tokens) -> bool:
        """Whether the ids so far end inside a reasoning block (the prompt opened it: R1, a thinking Qwen3-2507)."""
        return self.codec.opens_reasoning(tokens)

    def action_text(self, output_ids, opened_reasoning: bool = False) -> str:
        """A turn's text for the env: its end token dropped, special tokens kept where they are the family's markup,
        and the reasoning opener in front where the prompt opened it (so the turn parses whole)."""
        key = None  # a long turn is decoded without building a key: it seldom repeats
        if len(output_ids) <= CACHED_TURN_IDS:
            key = tuple(output_ids.tolist() if hasattr(output_ids, "tolist") else output_ids)
        text = None if key is None else self._turn_texts.get(key)
        if text is None:
            if self.markup_is_special:
                text = self.codec.turn_text(output_ids)
            else:
                text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
            if key is not None:
                _remember(self._turn_texts, key, text)
        return f"{self.family.reasoning_open}{text}" if opened_reasoning else text

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def parse(self, action: str, tools: list[dict] | None = None) -> ParsedTurn:
        return self.family.parse(action, tools=tools or None)

    def assistant_message(self, turn: ParsedTurn, output_ids) -> dict:
        """The turn as the message the template takes back. A turn with a malformed call is its text without special
        tokens (markup a template may refuse in content), without calls: the env answers it with errors, which
        become a user message."""
        if turn.errors:
            return {"role": "assistant", "content": self.decode(output_ids)}
        return self.codec.assistant_message(turn)

    def reasoning_length(self, output_ids, opened_reasoning: bool = False, tools: list[dict] | None = None) -> int:
        """How many of a turn's first ids are its reasoning block, markers included: through the last id the family's
        streaming parser reads in (or into, or out of) reasoning; all of them where the turn ended inside it."""
        scanner = self.family.stream(tools=tools or None, in_reasoning=opened_reasoning)
        stream, modes = TokenStream(self.codec, scanner), scanner.modes
        last = 0
        for index, token in enumerate(output_ids):
            before = modes[scanner.mode].channel
            delta = stream.feed((token,))
            if delta.reasoning or "reasoning" in (before, modes[scanner.mode].channel):
                last = index + 1
        if stream.finish()[0].reasoning:
            return len(output_ids)
        return last

    def closing_ids(self, history: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The ids that close a turn the length limit cut (the end token the template writes there)."""
        if self._single_closer is not None:
            return list(self._single_closer)
        _, tools = self.tools_placed([], tools)
        return self.codec.closing_ids(history, tools)

    def _closing_constant(self) -> list[int] | None:
        """The closing ids where they do not depend on the turn: a family with one closer, or none (GLM)."""
        closers = self.family.closers
        if not closers:
            return []
        return self.codec.encode(closers[0]) if len(closers) == 1 else None

    # ---- what follows a turn ----------------------------------------------------------------------------------

    def observation_messages(self, observation: str, info: dict, after: dict) -> list[dict]:
        """The messages an env's observation becomes after the assistant message `after`: one tool message per call
        result where the env gave them (`info["tool_results"]`, ToolEnv) and they answer the turn's calls, in
        order; else one user message."""
        results = info.get("tool_results") if isinstance(info, dict) else None
        calls = after.get("tool_calls") or []
        if results and len(results) == len(calls):
            named = [call["function"]["name"] for call in calls]
            if named == [result.get("name") for result in results]:
                return [
                    self.family.tool_message(call["id"], result["name"], str(result["content"]))
                    for call, result in zip(calls, results, strict=True)
                ]
        return [{"role": "user", "content": observation}]

    def continuation_ids(
        self, history: list[dict], new: list[dict], tools: list[dict] | None = None, ended_with: int | None = None
    ) -> list[int]:
        """The template's ids after the last assistant turn of `history` for the `new` messages and the next
        generation prompt, their content tokenized as text. NotAppendOnly where the template rewrites the history
        and chat.rewritten is new_sample."""
        _, tools = self.tools_placed([], tools)
        shape = self._shape(new, ended_with)
        split = self._splits.get(shape) if shape is not None else None
        if split is not None:  # a game repeats its replies, a tool its results: their ids are kept by their text
            key = (shape, *(m["content"] for m in new))
            ids = self._observations.get(key)
            if ids is None:
                ids = array("i", self._split_ids(split, [m["content"] for m in new]))
                _remember(self._observations, key, ids)
            return list(ids)
        ids = self._rendered_continuation(history, new, tools, ended_with)
        if shape is not None and shape not in self._splits and self._append_only(new):
            if len(self._splits) >= CACHED_TEXTS:
                self._splits.clear()
            self._splits[shape] = self._find_split(history, new, tools, ended_with)
        return ids

    def _rendered_continuation(self, history, new, tools, ended_with) -> list[int]:
        full, start = self.codec.continuation_start(history, new, tools, ended_with, self.keep_rewritten)
        spans = []
        if any(self.content.may_form_control(m.get(f) or "") for m in new for f in self.text_fields):
            text, spans = self.content.rendered(
                lambda shown: self.codec.render(shown, tools, True), [*history, *new], self.text_fields
            )
            if text != full:  # the template rendered differently for the content marks: no spans to trust
                spans = []
        return self.content.ids(full, spans, start)

    def _shape(self, new: list[dict], ended_with: int | None) -> tuple | None:
        """What the template's text around the new messages' contents may depend on besides the contents (call ids
        aside: a split is kept only where the template does not write them)."""
        if not all(isinstance(m.get("content"), str) for m in new):
            return None
        try:
            fields = tuple(
                tuple(sorted((k, *_shape_value(v)) for k, v in m.items() if k not in ("content", ID))) for m in new
            )
        except (TypeError, ValueError):
            return None
        return fields, ended_with if not self.family.closers else None

    def _append_only(self, new: list[dict]) -> bool:
        """Whether the probe found the template append-only for messages of these roles."""
        roles = {m["role"] for m in new}
        if roles == {"tool"}:
            return self.probe.append_only_after_tool
        if roles == {"user"}:
            return self.probe.append_only_after_user
        return False

    def _find_split(self, history, new, tools, ended_with) -> Split | None:
        """The template's text around each new message's content and how it writes the content (as it is, or as a
        JSON string's inside: `| tojson`), checked with the actual contents, awkward ones and another call id; None
        (always render) where no way fits."""
        marks = [f"{PLACEHOLDER}{i}{PLACEHOLDER}" for i in range(len(new))]
        marked_new = [{**m, "content": mark} for m, mark in zip(new, marks, strict=True)]
        full, start = self.codec.continuation_start(history, marked_new, tools, ended_with, self.keep_rewritten)
        pieces, rest = [], full[start:]
        for mark in marks:
            before, found, rest = rest.partition(mark)
            if not found:
                return None
            pieces.append(before)
        pieces.append(rest)
        checks = [
            [{**m, "content": AWKWARD_CONTENT} for m in new],
            [{**m, **({ID: m[ID][::-1]} if isinstance(m.get(ID), str) else {})} for m in new],  # another call id
            new,
        ]
        written = [
            (full, start, [m["content"] for m in shown])
            for shown in checks
            for full, start in [self.codec.continuation_start(history, shown, tools, ended_with, self.keep_rewritten)]
        ]
        for form in CONTENT_FORMS:
            split = Split(pieces, form)
            if all(full[start:] == split.text(contents) for full, start, contents in written):
                return split
        return None

    def _split_ids(self, split: Split, contents: list[str]) -> list[int]:
        spans, at = [], 0
        for piece, content in zip(split.pieces, contents, strict=False):
            at += len(piece)
            shown = split.form(content)
            if self.content.may_form_control(shown):
                spans.append((at, at + len(shown)))
            at += len(shown)
        return self.content.ids(split.text(contents), spans)

    def new_sample_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The template's ids for the whole conversation so far and the generation prompt (chat.rewritten=new_sample:
        the next sample's prompt)."""
        messages, tools = self.tools_placed(messages, tools)
        text, spans = self.content.rendered(
            lambda shown: self.codec.render(shown, tools, True), messages, self.text_fields
        )
        return self.content.ids(text, spans)

    # ---- SFT transcripts (agentrl/sft/transcripts.py): a user message after an assistant turn -------------

    def observation_ids(self, observation: str) -> list[int]:
        """The template's tokens between an assistant turn's end-of-turn token and the next generation prompt for
        a user message `observation`, tokenized as text."""
        ids = self._observations.get(observation)
        if ids is None:
            before, after = self._observation_template
            ids = array("i", self.content.wrapped_ids(before, observation, after))
            _remember(self._observations, observation, ids)
        return list(ids)

    @property
    def _observation_template(self) -> tuple[str, str]:
        """(before, after): the template's text around a user message's content after an assistant turn's end."""
        if self._observation_split is None:
            self._observation_split = self._split_observation_template()
        return self._observation_split

    def _split_observation_template(self) -> tuple[str, str]:
        eos = self.tokenizer.eos_token
        base = [*self._head(), {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        closed = self.codec.render(base, None, False)
        full = self.codec.render([*base, {"role": "user", "content": PLACEHOLDER}], None, True)
        end_of_turn = closed.rfind("a" + eos)
        if end_of_turn < 0 or not full.startswith(closed[: end_of_turn + 1 + len(eos)]):
            raise ValueError(
                "the chat template does not end assistant turns with the eos token "
                f"{eos!r}; agentrl needs that to append observations without re-tokenizing"
            )
        before, _, after = full[end_of_turn + 1 + len(eos) :].partition(PLACEHOLDER)
        return before, after


@dataclass(frozen=True)
class Split:
    """The template's text around the contents of a shape of messages (one piece more than contents), and how it
    writes each content."""

    pieces: list[str]
    form: Callable[[str], str]

    def text(self, contents: list[str]) -> str:
        written = "".join(piece + self.form(c) for piece, c in zip(self.pieces, contents, strict=False))
        return written + self.pieces[-1]


def _json_inside(content: str) -> str:
    return json.dumps(content, ensure_ascii=False)[1:-1]


CONTENT_FORMS: tuple[Callable[[str], str], ...] = (str, _json_inside)  # as it is; `| tojson` (Llama 3, harmony)


def call_format(codec: ChatCodec) -> str:
    """How `codec`'s family writes a call: one call as the template writes it after its generation prompt (for a
    tools listing in the system message)."""
    head = [{"role": "user", "content": "u"}]
    message = codec.family.assistant_message(ParsedTurn(calls=[EXAMPLE_CALL]))
    prompt = codec.prompt_ids(head)
    whole = codec.encode(codec.render([*head, message], None, False))
    same = next((i for i, (a, b) in enumerate(zip(prompt, whole, strict=False)) if a != b), len(prompt))
    written = codec.without_end(codec.decode(whole[same:]).rstrip())
    arguments = json.dumps(EXAMPLE_CALL.arguments)
    return (
        f"To call a tool, write the call as this call of {EXAMPLE_CALL.name} with the arguments {arguments} "
        f"is written: {written}"
    )


def _prompt_key(first_observation: str, tools: list[dict] | None, context: list[dict]) -> tuple | None:
    """What a prompt's ids depend on, as a dict key; None (not cached) when tools or context are not JSON."""
    try:
        return (
            first_observation,
            json.dumps(tools, sort_keys=True) if tools else "",
            json.dumps(list(context), sort_keys=True) if context else "",
        )
    except (TypeError, ValueError):
        return None


def _shape_value(value) -> tuple[str, str]:
    """A message field's value in a shape key: a string as it is (most are: roles, names), anything else as JSON."""
    return ("text", value) if isinstance(value, str) else ("json", json.dumps(value, sort_keys=True))


def _remember(cache: dict, key, value) -> None:
    if len(cache) >= CACHED_TEXTS:
        cache.clear()
    cache[key] = value


def tools_as_text(tools: list[dict]) -> str:
    """A plain-text tool list and the call format, for chat templates that do not render tools."""
    lines = ["You can call these tools:"]
    for spec in tools:
        function = spec.get("function", spec)
        lines.append(f"- {function['name']}: {function.get('description', '')}")
        lines.append(f"  parameters: {json.dumps(function.get('parameters', {}), separators=(',', ':'))}")
    lines.append('To call a tool, write <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>.')
    lines.append("Without a tool call, your reply is your final answer.")
    return "\n".join(lines)


__all__ = ["ChatFormat", "NotAppendOnly", "call_format", "tools_as_text"]
