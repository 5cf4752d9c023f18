"""Transcripts of a model in a chat format family (docs/chat-formats.md) -> token ids and loss mask, through the model's
own chat template as an episode of that family builds them.

`ChatCodec.conversation_ids` does the work: the prompt at mask 0; each assistant turn as the template writes it after
its own generation prompt, stop token included, at mask 1 (its reasoning included); the
template's ids for the tool results or user message after it at mask 0. Before that the messages are put in the form
the family's template takes: a call's arguments a mapping (JSON text for DeepSeek), reasoning under the family's
`reasoning_key` (`reasoning_content`, harmony's `thinking`; a transcript may write any of them), tools the template
does not render listed in the system message as the agent loop lists them (`ChatFormat.tools_placed`). With
`train_reasoning=False` (chat.train_reasoning) each turn's reasoning block is at mask 0, as the agent loop masks it.

A template that renders a turn differently once more messages follow (Qwen3 after a user follow-up) raises
`NotAppendOnly` unless `keep_rewritten` (the turn trained as generated). R1's template never writes reasoning back, not
even for the last turn: with `keep_rewritten` each R1 turn is the text the model writes after the prompt's `<think>`
(its reasoning, `</think>`, the answer); without, a TranscriptError says so.
"""

from __future__ import annotations

import json

from agentrl.chat.codec import ChatCodec
from agentrl.chat.errors import ChatTemplateError, NotAppendOnly
from agentrl.sft.transcripts import REASONING_KEYS, Tokenized, TranscriptError, episode_shape


class ChatTranscripts:
    """Token ids and loss masks of transcripts for `codec`'s family; `default_system_prompt` for transcripts
    without a system message (the RL run's `env.system_prompt`)."""

    def __init__(
        self,
        codec: ChatCodec,
        default_system_prompt: str | None = None,
        keep_rewritten: bool = False,
        train_reasoning: bool = True,
    ):
        from agentrl.models.chat_format import ChatFormat

        self.codec, self.family = codec, codec.family
        self.default_system_prompt = default_system_prompt
        self.keep_rewritten, self.train_reasoning = keep_rewritten, train_reasoning
        self.loop_chat = ChatFormat(codec.tokenizer, codec=codec)  # the agent loop's: tools placed, reasoning measured

    def __call__(self, messages, tools: list[dict] | None = None) -> Tokenized:
        episode_shape(messages)  # the roles an episode can produce, or a TranscriptError saying what is wrong
        last = max(i for i, message in enumerate(messages) if message["role"] == "assistant")
        messages = [self.message(message, index) for index, message in enumerate(messages[: last + 1])]
        if messages[0]["role"] != "system" and self.default_system_prompt:
            messages.insert(0, {"role": "system", "content": self.default_system_prompt})
        messages, tools = self.loop_chat.tools_placed(messages, tools or None)
        try:
            ids, mask = self.codec.conversation_ids(messages, tools, self.keep_rewritten)
        except NotAppendOnly as error:
            raise TranscriptError(f"{self.family.name} transcript: {error}") from None
        except ChatTemplateError as error:
            raise TranscriptError(str(error)) from None
        if not self.train_reasoning and self.family.reasoning_key:
            self.mask_reasoning(ids, mask, tools)
        out = Tokenized()
        out.tokens, out.loss_mask = ids, mask
        return out

    def mask_reasoning(self, ids: list[int], mask: list[int], tools: list[dict] | None) -> None:
        """Each trained turn's reasoning block at loss mask 0 (chat.train_reasoning=false), as the agent loop does."""
        start = 0
        while start < len(mask):
            if not mask[start]:
                start += 1
                continue
            end = mask.index(0, start) if 0 in mask[start:] else len(mask)
            opened = self.codec.opens_reasoning(ids[:start])
            length = self.loop_chat.reasoning_length(ids[start:end], opened, tools)
            mask[start : start + length] = [0] * length
            start = end

    def message(self, message: dict, index: int) -> dict:
        """`message` as the family's template takes it."""
        message = dict(message)
        reasoning = [key for key in REASONING_KEYS if message.get(key)]
        if reasoning:
            if message["role"] != "assistant":
                raise TranscriptError(f"message {index} is a {message['role']} message with reasoning ({reasoning[0]})")
            if self.family.reasoning_key is None:
                raise TranscriptError(
                    f"message {index} has reasoning ({reasoning[0]}), but the {self.family.name} format writes none; "
                    "remove it from the transcripts, or train a model in a format that reasons (qwen3, deepseek_r1, "
                    "glm45, harmony)"
                )
            if len({message[key] for key in reasoning}) > 1:
                raise TranscriptError(f"message {index} has two different reasonings: {', '.join(reasoning)}")
            text = message[reasoning[0]]
            for key in reasoning:
                del message[key]
            message[self.family.reasoning_key] = text
        if message.get("content") is None:
            message["content"] = ""
        if message.get("tool_calls"):
            message["tool_calls"] = [self.call(call, index) for call in message["tool_calls"]]
        return message

    def call(self, call: dict, index: int) -> dict:
        """One call with its arguments as the template takes them: a mapping, or JSON text where
        `family.arguments_as_text`."""
        function = dict(call["function"]) if "function" in call else {k: v for k, v in call.items() if k != "id"}
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                raise TranscriptError(
                    f"message {index}: tool call {function.get('name')!r} has arguments that are not JSON"
                ) from None
        function["arguments"] = (
            json.dumps(arguments, ensure_ascii=False) if self.family.arguments_as_text else arguments
        )
        return {**({"id": call["id"]} if call.get("id") else {}), "type": "function", "function": function}


def transcript_tokenizer(
    tokenizer,
    default_system_prompt: str | None = None,
    chat_format: str | None = None,
    template_kwargs: dict | None = None,
    keep_rewritten: bool = False,
    model_type: str | None = None,
    train_reasoning: bool = True,
):
    """The transcript tokenizer of a model: for the Hermes format (agentrl's own tiny model, Qwen2.5) the one the
    Hermes agent loop matches (agentrl.sft.transcripts.TranscriptTokenizer); for any other family (`chat_format`,
    else detected) `ChatTranscripts`. UserError where the family cannot be told or the template cannot serve."""
    from agentrl.chat.codec import load_codec
    from agentrl.chat.detect import UnknownChatFormat
    from agentrl.errors import UserError
    from agentrl.sft.transcripts import TranscriptTokenizer

    try:
        codec = load_codec(tokenizer, chat_format, template_kwargs, model_type)
    except (UnknownChatFormat, ChatTemplateError) as error:
        raise UserError(f"agentrl sft: {error}") from None
    if codec.family.name == "hermes":
        return TranscriptTokenizer(tokenizer, default_system_prompt)
    return ChatTranscripts(codec, default_system_prompt, keep_rewritten, train_reasoning)
