"""Messages and tools -> the exact prompt token ids, through the model's chat template and its family's codec
(agentrl/chat, docs/chat-formats.md); generated ids -> the reply's content, reasoning and tool calls (`reply.py`).

The family is detected from the tokenizer (its special tokens, its template, the folder's model_type) or named
(`agentrl serve --chat-format`, the config's `chat.format`). Tools go to the template's `tools=`; a template that
does not render them gets them in the system message as text, with the family's own call format. An assistant
message a client sends back is written the family's way: its tool calls (arguments as JSON text where the template
takes text), its reasoning under the key the template reads. Message content, and an assistant message's
reasoning, is tokenized as text: a control string inside it never becomes a turn marker
(agentrl/models/content_tokens.py). The ids returned are the ids the engine gets.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.chat import ChatTemplateError, ParsedTurn, ToolCall, load_codec
from agentrl.chat.detect import model_type_of
from agentrl.chat.hermes import CLOSE, OPEN, HermesFamily
from agentrl.chat.tool_schemas import tool_name, unrendered_tool
from agentrl.models.chat_format import PROBE_TOOL, tools_as_text
from agentrl.models.content_tokens import ContentError, content_tokenizer, spans_without
from agentrl.serve.protocol import APIError, ChatMessage

# The call the tools listing shows as the family's format, for templates that do not render tools.
EXAMPLE_CALL = ToolCall("tool_name", {"argument": "value"})


class ChatRenderer:
    """`chat_format`: a registered family name or `module:Class` (None: detect it from the tokenizer)."""

    def __init__(self, tokenizer, chat_format: str | None = None):
        if not tokenizer.chat_template:  # before detection, which would only say that no family fits
            raise ChatTemplateError(
                "the tokenizer has no chat template; serve an instruct/chat model folder (its chat_template.jinja, or "
                "chat_template in tokenizer_config.json) or set tokenizer.chat_template"
            )
        folder = Path(tokenizer.name_or_path) if getattr(tokenizer, "name_or_path", "") else None
        model_type = model_type_of(folder) if folder is not None and folder.is_dir() else None
        self.codec = load_codec(tokenizer, chat_format, model_type=model_type)
        self.family = self.codec.family
        self.tokenizer = tokenizer
        self.content = content_tokenizer(tokenizer)
        self.stop_ids = self.codec.stop_ids
        self.text_fields = ("content", self.family.reasoning_key) if self.family.reasoning_key else ("content",)
        probe = [{"role": "user", "content": "u"}]
        try:
            self.codec.render(probe)  # a template that cannot render a user message fails here, once
        except ChatTemplateError as error:
            raise ChatTemplateError(
                f"{error}; a chat template must render one user message and the generation prompt: fix the model "
                "folder's chat template (chat_template.jinja, or chat_template in tokenizer_config.json)"
            ) from None
        self.renders_tools = self._renders_tools(probe)
        self.renders_calls = self._renders_calls(probe)
        self._call_format: str | None = None

    def _renders_tools(self, head: list[dict]) -> bool:
        """Whether the template lists `tools=` (a template that refuses them gets them as system text)."""
        try:
            return PROBE_TOOL["function"]["name"] in self.codec.render(head, [PROBE_TOOL])
        except ChatTemplateError:
            return False

    def _renders_calls(self, head: list[dict]) -> bool:
        """Whether the template writes an assistant message's `tool_calls` (the tiny test template does not)."""
        name = PROBE_TOOL["function"]["name"]
        message = self.family.assistant_message(ParsedTurn(calls=[ToolCall(name, {})]))
        try:
            return name in self.codec.render([*head, message], None, generation_prompt=False)
        except ChatTemplateError:
            return False

    # ---- prompts --------------------------------------------------------------------------------------------

    def prompt_ids(self, messages: list[ChatMessage], tools: list[dict] | None = None) -> list[int]:
        text, spans = self.rendered([self.plain_message(m) for m in messages], tools)
        return self.content.ids(text, spans)

    def render_text(self, plain: list[dict], tools: list[dict] | None, generation_prompt: bool = True) -> str:
        """The template's text for plain messages (`plain_message`), tools in the template or in the system message."""
        plain, tools = self.tools_placed(plain, tools)
        return self._render_checked(plain, tools, generation_prompt)

    def rendered(
        self, plain: list[dict], tools: list[dict] | None, generation_prompt: bool = True
    ) -> tuple[str, list[tuple[int, int]]]:
        """`render_text`, and the spans in it of the content to tokenize as text (`ContentTokenizer.rendered`)."""
        listed = bool(tools) and not self.renders_tools
        plain, tools = self.tools_placed(plain, tools)
        try:
            text, spans = self.content.rendered(
                lambda shown: self._render_checked(shown, tools, generation_prompt), plain, self.text_fields
            )
        except ContentError as error:
            raise APIError(str(error), param="messages") from None
        if tools and not all(tool_name(tool) in text for tool in tools):
            self._refuse_unrendered(plain, tools)
        if listed and spans and not isinstance(self.family, HermesFamily):
            # the call format line is agentrl's own text: its markup stays the family's special tokens
            spans = spans_without(spans, text, self.call_format())
        return text, spans

    def tools_placed(self, plain: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
        """The messages and the template's tools: a template that does not render tools gets them as system text."""
        if not tools or self.renders_tools:
            return plain, tools
        listing = self.tools_text(tools)
        plain = list(plain)
        if plain and plain[0]["role"] == "system":
            plain[0] = {**plain[0], "content": f"{plain[0]['content']}\n\n{listing}"}
        else:
            plain.insert(0, {"role": "system", "content": listing})
        return plain, None

    def tools_text(self, tools: list[dict]) -> str:
        """The tools as system text (`tools_as_text`), with the call format the family writes."""
        listing = tools_as_text(tools)
        if isinstance(self.family, HermesFamily):  # tools_as_text's own call format is Hermes'
            return listing
        hermes_line = tools_as_text([]).splitlines()[1]
        return listing.replace(hermes_line, self.call_format())

    def call_format(self) -> str:
        """How this family writes a call: one call as the template writes it after its generation prompt."""
        if self._call_format is None:
            head = [{"role": "user", "content": "u"}]
            message = self.family.assistant_message(ParsedTurn(calls=[EXAMPLE_CALL]))
            prompt = self.codec.prompt_ids(head)
            whole = self.codec.encode(self.codec.render([*head, message], None, False))
            same = next((i for i, (a, b) in enumerate(zip(prompt, whole, strict=False)) if a != b), len(prompt))
            written = self.codec.without_end(self.codec.decode(whole[same:]).rstrip())
            arguments = json.dumps(EXAMPLE_CALL.arguments)
            self._call_format = (
                f"To call a tool, write the call as this call of {EXAMPLE_CALL.name} with the arguments {arguments} "
                f"is written: {written}"
            )
        return self._call_format

    def _render_checked(self, plain: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        try:
            return self.codec.render(plain, tools, generation_prompt)
        except ChatTemplateError as error:  # the template's own checks (role order, ...)
            if tools:
                self._refuse_unrendered(plain, tools)
            raise APIError(str(error), param="messages") from None

    def _refuse_unrendered(self, plain: list[dict], tools: list[dict]) -> None:
        """A 400 naming the request's tool that the template raises on or leaves out, if one is."""
        found = unrendered_tool(self.codec, tools, plain)
        if found is not None:
            raise APIError(
                f"tool {found.name!r} cannot go into the prompt: {found.problem}; change its JSON schema to one the "
                f"{self.family.name} template renders (its parameters' types, names, descriptions)",
                param="tools",
            )

    def plain_message(self, message: ChatMessage) -> dict:
        """A request's message as the template takes it: an assistant message written by the family (its calls,
        its reasoning under the family's key), the others' text, tool_call_id and name."""
        if message.role == "assistant":
            return self._assistant_message(message)
        plain = {"role": message.role, "content": message.text()}
        if message.tool_call_id is not None:
            plain["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            plain["name"] = message.name
        return plain

    def _assistant_message(self, message: ChatMessage) -> dict:
        content = message.text()
        calls = [ToolCall(c.function.name, _arguments(c.function.arguments), c.id) for c in message.tool_calls or ()]
        if calls and not self.renders_calls:
            if not isinstance(self.family, HermesFamily):
                raise APIError(
                    f"the {self.family.name} chat template does not write an assistant message's tool_calls; serve "
                    "the model with a template that does (the model folder's own)",
                    param="messages",
                )
            # the model sees its own calls as it wrote them
            content += "".join(f"{OPEN}{json.dumps({'name': c.name, 'arguments': c.arguments})}{CLOSE}" for c in calls)
            calls = []
        turn = ParsedTurn(calls=calls, content=content, reasoning=message.reasoning_text())
        ids = [call.id or self.family.new_call_id() for call in calls]
        plain = self.family.assistant_message(turn, ids)
        if message.name is not None:
            plain["name"] = message.name
        return plain

    def text(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


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


def held_tail(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest tail of `text` that is a proper prefix of a stop string (it may still become one)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def streamable_prefix(text: str, stops: tuple[str, ...], final: bool) -> str:
    """The part of a completion's text so far a stream may send now: never past a stop string, never a tail that
    could still grow into one, nor a half-decoded character. `final`: the text is complete."""
    text, _ = cut_at_stop(text, stops)
    if final:
        return text
    text = text.rstrip("\ufffd")  # a multi-byte character whose last bytes are still to come
    return text[: len(text) - held_tail(text, stops)]
