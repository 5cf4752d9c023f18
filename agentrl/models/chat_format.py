"""Token ids for a conversation built turn by turn, never re-tokenized.

The prompt is tokenized once through the chat template. After that, generated tokens are
appended exactly as the engine produced them, and each observation contributes only the
template's text *between* the end of the assistant turn and the next generation prompt,
found by rendering the template with and without the new message.

Tools (JSON-schema function specs from the env's reset) go to the template's `tools=`
argument. A template that ignores tools (like the tiny test model's) gets a plain-text
tool list appended to the system message instead, so small models still see them.

Every message's content (the system prompt and tools text, a dataset's context, each observation) is tokenized as
text: a control string such as `<|im_end|>` inside it is its characters' tokens, never a turn marker
(agentrl/models/content_tokens.py).
"""

from __future__ import annotations

import json
from array import array

from agentrl.models.content_tokens import content_tokenizer

PLACEHOLDER = "\u2591agentrl\u2591"
# Prompts and observations kept by their text (their ids as int32 arrays: 8 MB for 1024 prompts of 2,000 tokens): a
# group's episodes share one prompt, a dataset repeats rows, a game repeats its replies, and rendering one through the
# template costs ~100 us. A full cache is emptied and fills again.
CACHED_TEXTS = 1024
PROBE_TOOL = {
    "type": "function",
    "function": {"name": "agentrl_probe_tool", "description": "", "parameters": {"type": "object", "properties": {}}},
}


class ChatFormat:
    def __init__(self, tokenizer, system_prompt: str | None = None):
        if tokenizer.chat_template is None:
            raise ValueError(
                "the tokenizer has no chat template; use an instruct/chat model or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.content = content_tokenizer(tokenizer)
        self.system_prompt = system_prompt
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self.stop_ids = (self.eos_id,)
        self._observation_template = self._split_observation_template()
        self._prompts: dict[tuple, array] = {}
        self._observations: dict[str, array] = {}
        probe = [{"role": "user", "content": "u"}]
        self.template_renders_tools = PROBE_TOOL["function"]["name"] in self._render(probe, True, [PROBE_TOOL])

    def _render(self, messages: list[dict], generation_prompt: bool, tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )

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
        if tools and not self.template_renders_tools:
            system = messages[0]["content"] if messages[0]["role"] == "system" else None
            rest = messages[1:] if system is not None else messages
            messages, tools = [*self._head(tools_as_text(tools), system), *rest], None
        text, spans = self.content.rendered(lambda shown: self._render(shown, True, tools), messages)
        return self.content.ids(text, spans)

    def _split_observation_template(self) -> tuple[str, str]:
        """(before, after): the text around an observation that follows an assistant turn.

        `before` starts right after the assistant's end-of-turn token, which the engine
        generated (or the loop appended), and ends where the observation's text begins.
        """
        eos = self.tokenizer.eos_token
        base = [*self._head(), {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        closed = self._render(base, False)
        full = self._render([*base, {"role": "user", "content": PLACEHOLDER}], True)
        end_of_turn = closed.rfind("a" + eos)
        if end_of_turn < 0 or not full.startswith(closed[: end_of_turn + 1 + len(eos)]):
            raise ValueError(
                "the chat template does not end assistant turns with the eos token "
                f"{eos!r}; agentrl needs that to append observations without re-tokenizing"
            )
        delta = full[end_of_turn + 1 + len(eos) :]
        before, _, after = delta.partition(PLACEHOLDER)
        return before, after

    def observation_ids(self, observation: str) -> list[int]:
        """The template's tokens between an assistant turn's end-of-turn token and the next generation prompt, the
        observation (an env's text, a tool result) tokenized as text."""
        ids = self._observations.get(observation)
        if ids is None:
            before, after = self._observation_template
            ids = array("i", self.content.wrapped_ids(before, observation, after))
            _remember(self._observations, observation, ids)
        return list(ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


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


def _remember(cache: dict, key, ids: array) -> None:
    if len(cache) >= CACHED_TEXTS:
        cache.clear()
    cache[key] = ids


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
