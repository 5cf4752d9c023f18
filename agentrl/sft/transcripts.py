"""A chat transcript (Hugging Face messages) -> token ids and loss mask, exactly as an RL episode builds them.

An RL episode (agentrl/rollout/agent_loop.py) is: the prompt from `ChatFormat.prompt_ids`
(system prompt, tools, first user message) at mask 0; each assistant turn as the tokens the
model generated, ending in the eos (stop) token, at mask 1; each observation between turns
from `ChatFormat.observation_ids` at mask 0. A transcript is tokenized the same way, so a
model fine-tuned on it has been trained on exactly the token sequences RL will sample and
score:

- every message's content is tokenized as text: a control string in it (`<|im_end|>`) is its
  characters' tokens, never a special token (agentrl/models/content_tokens.py);
- an assistant turn is its text tokenized alone, plus the eos id. Hugging Face `tool_calls`
  become `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks after the content
  (one line each), the format `agentrl.env.tool_calls` parses;
- the `tool` messages after a turn become one observation: each result in a
  `<tool_response>` block, joined by newlines, as `ToolEnv.run_tools` writes it (a result
  that is already wrapped is kept as it is);
- a `user` message after an assistant turn is an observation.

Roles must follow what an episode can produce: an optional system message, a user
message, then assistant turns, each followed by either one user message or the tool
results of its calls. Messages after the last assistant turn carry no loss and are dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from agentrl.env.tool_calls import CLOSE, OPEN, parse_tool_calls
from agentrl.models.chat_format import ChatFormat

RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
ROLES = ("system", "user", "assistant", "tool")
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")  # where a transcript's assistant reasoning may be


class TranscriptError(ValueError):
    """A transcript that cannot be an episode; the message says what is wrong (the caller adds file and line)."""


@dataclass
class Tokenized:
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)

    def extend(self, ids: list[int], mask: int) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([mask] * len(ids))


def format_tool_call(call: dict) -> str:
    """One Hugging Face tool call as the text block a model writes: `<tool_call>{...}</tool_call>`."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise TranscriptError(
            f'a tool call must look like {{"type": "function", "function": {{"name": ..., "arguments": {{...}}}}}}, '
            f"got {json.dumps(call)[:200]}"
        )
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):  # the OpenAI wire format keeps arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise TranscriptError(
                f"tool call {function['name']!r}: arguments is a string that is not JSON: {arguments[:200]!r}"
            ) from None
    if not isinstance(arguments, dict):
        raise TranscriptError(f"tool call {function['name']!r}: arguments must be a JSON object")
    return OPEN + json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False) + CLOSE


def assistant_text(message: dict) -> str:
    """The text the model generates for an assistant message: its content, then its tool calls, one a line.

    Content that already holds `<tool_call>` blocks is the model's own text (a dump may keep it beside the
    parsed `tool_calls`): it is used as it is.
    """
    content = _content(message)
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise TranscriptError("an assistant message's tool_calls must be a list")
    if OPEN in content:
        return content
    return "\n".join([*([content] if content else []), *(format_tool_call(call) for call in calls)])


def tool_observation(results: list[str]) -> str:
    """The observation a ToolEnv returns for these tool results."""
    wrapped = []
    for result in results:
        stripped = result.strip()
        if stripped.startswith(RESPONSE_OPEN) and stripped.endswith(RESPONSE_CLOSE):
            wrapped.append(result)
        else:
            wrapped.append(f"{RESPONSE_OPEN}\n{result}\n{RESPONSE_CLOSE}")
    return "\n".join(wrapped)


def _content(message: dict) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, list):  # multimodal-style parts: keep the text ones
        parts = [part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"]
        if len(parts) != len(content):
            raise TranscriptError(f"{message['role']} message content has non-text parts; only text is supported")
        return "".join(parts)
    if not isinstance(content, str):
        raise TranscriptError(f"{message['role']} message content must be a string, got {type(content).__name__}")
    return content


@dataclass
class Shape:
    """An episode's shape: system prompt, first user message, and (assistant text, observation or None) turns."""

    system: str | None
    first: str
    turns: list[tuple[str, str | None]]


def episode_shape(messages) -> Shape:
    """Check the roles' order and group the messages into an episode's turns; TranscriptError says what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise TranscriptError("messages must be a non-empty list of {role, content} objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            got = message.get("role") if isinstance(message, dict) else type(message).__name__
            raise TranscriptError(f"message {index} has role {got!r}; roles are {', '.join(ROLES)}")
    position = 0
    system = None
    if messages[0]["role"] == "system":
        system, position = _content(messages[0]), 1
    if position >= len(messages) or messages[position]["role"] != "user":
        got = messages[position]["role"] if position < len(messages) else "nothing"
        raise TranscriptError(
            f"message {position} must be the first user message (after an optional system one), got {got}"
        )
    first = _content(messages[position])
    position += 1
    turns: list[tuple[str, str | None]] = []
    while position < len(messages):
        message = messages[position]
        if message["role"] != "assistant":
            before = messages[position - 1]["role"]
            raise TranscriptError(
                f"message {position} is a {message['role']} message after a {before} message; an episode alternates "
                "assistant turns with one user message or the tool results of the turn's calls"
            )
        text = assistant_text(message)
        has_calls = bool(message.get("tool_calls")) or parse_tool_calls(text).has_calls
        position += 1
        tools = []
        while position < len(messages) and messages[position]["role"] == "tool":
            if not has_calls:
                raise TranscriptError(
                    f"message {position} is a tool message, but the assistant turn before it (message "
                    f"{position - 1 - len(tools)}) made no tool call"
                )
            tools.append(_content(messages[position]))
            position += 1
        if tools:
            observation = tool_observation(tools)
        elif position < len(messages) and messages[position]["role"] == "user":
            observation = _content(messages[position])
            position += 1
        elif position < len(messages):
            raise TranscriptError(
                f"message {position} is a {messages[position]['role']} message right after an assistant turn; "
                "an assistant turn is followed by a user message or tool results"
            )
        else:
            observation = None
        if observation is not None and position < len(messages) and messages[position]["role"] in ("user", "tool"):
            raise TranscriptError(
                f"message {position} is a {messages[position]['role']} message after a "
                f"{messages[position - 1]['role']} message; one observation follows each assistant turn (merge them)"
            )
        turns.append((text, observation))
    if not turns:
        raise TranscriptError("the transcript has no assistant turn, so nothing to train on")
    turns[-1] = (turns[-1][0], None)  # an observation after the last turn is never followed by a trained token
    return Shape(system, first, turns)


class TranscriptTokenizer:
    """Token ids and loss masks of transcripts, through `ChatFormat` as the RL agent loop uses it."""

    def __init__(self, tokenizer, default_system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.default_system_prompt = default_system_prompt
        self._formats: dict[str | None, ChatFormat] = {}

    def chat(self, system_prompt: str | None) -> ChatFormat:
        """The ChatFormat an RL run with `env.system_prompt = system_prompt` builds."""
        if system_prompt not in self._formats:
            self._formats[system_prompt] = ChatFormat(self.tokenizer, system_prompt=system_prompt)
        return self._formats[system_prompt]

    def __call__(self, messages, tools: list[dict] | None = None) -> Tokenized:
        shape = episode_shape(messages)
        chat = self.chat(shape.system if shape.system is not None else self.default_system_prompt)
        out = Tokenized()
        out.extend(chat.prompt_ids(shape.first, tools or None), mask=0)
        for text, observation in shape.turns:
            out.extend([*chat.content.content_ids(text), chat.eos_id], mask=1)
            if observation is not None:
                out.extend(chat.observation_ids(observation), mask=0)
        return out
