"""ChatFormat keeps the ids of prompts and observations it rendered: a repeat gets the same ids without rendering the
template again, anything that changes the prompt renders anew, and a caller changing its list changes no cache."""

from __future__ import annotations

import string

import pytest

from agentrl.models import chat_format as chat_module
from agentrl.models.chat_format import ChatFormat
from agentrl.models.tiny import build_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "adds", "parameters": {}}}]
CONTEXT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([string.printable, "hello world assistant user system higher lower"], vocab_size=200)


def counting(chat: ChatFormat) -> list[int]:
    """Counts the template renders of `chat` in the returned list's one element."""
    renders = [0]
    render = chat.codec.render

    def counted(*args, **kwargs):
        renders[0] += 1
        return render(*args, **kwargs)

    chat.codec.render = counted
    return renders


@pytest.mark.parametrize("tools, context", [(None, ()), (TOOLS, ()), (None, CONTEXT), (TOOLS, CONTEXT)])
def test_a_repeated_prompt_has_the_ids_of_a_fresh_render_without_rendering_again(tokenizer, tools, context):
    fresh = ChatFormat(tokenizer, system_prompt="Answer with a number.")._render_prompt("What is 2+3?", tools, context)
    chat = ChatFormat(tokenizer, system_prompt="Answer with a number.")
    renders = counting(chat)
    first = chat.prompt_ids("What is 2+3?", tools, context)
    after_first = renders[0]
    again = chat.prompt_ids("What is 2+3?", tools, context)
    assert first == again == fresh
    assert after_first > 0 and renders[0] == after_first


def test_a_different_observation_tool_list_or_context_renders_anew(tokenizer):
    chat = ChatFormat(tokenizer)
    base = chat.prompt_ids("What is 2+3?")
    variants = [
        chat.prompt_ids("What is 2+4?"),
        chat.prompt_ids("What is 2+3?", TOOLS),
        chat.prompt_ids("What is 2+3?", None, CONTEXT),
        chat.prompt_ids("What is 2+3?", [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "sums"}}]),
    ]
    fresh = ChatFormat(tokenizer)
    expected = [
        fresh._render_prompt("What is 2+4?", None, ()),
        fresh._render_prompt("What is 2+3?", TOOLS, ()),
        fresh._render_prompt("What is 2+3?", None, CONTEXT),
        fresh._render_prompt(
            "What is 2+3?", [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "sums"}}], ()
        ),
    ]
    assert variants == expected
    assert all(ids != base for ids in variants)


def test_changing_a_returned_list_leaves_the_next_call_alone(tokenizer):
    chat = ChatFormat(tokenizer)
    prompt = chat.prompt_ids("What is 2+3?")
    observation = chat.observation_ids("higher, between 5 and 7")
    kept_prompt, kept_observation = list(prompt), list(observation)
    prompt.append(0)
    observation.clear()
    assert chat.prompt_ids("What is 2+3?") == kept_prompt
    assert chat.observation_ids("higher, between 5 and 7") == kept_observation


def test_observation_ids_are_those_of_the_template_split_and_a_full_cache_starts_over(tokenizer, monkeypatch):
    monkeypatch.setattr(chat_module, "CACHED_TEXTS", 3)
    chat = ChatFormat(tokenizer)
    before, after = chat._observation_template
    texts = [f"lower, between 1 and {n}" for n in range(2, 9)]
    for text in texts:
        assert chat.observation_ids(text) == chat.content.wrapped_ids(before, text, after)
        assert len(chat._observations) <= 3
    assert chat.observation_ids(texts[0]) == chat.content.wrapped_ids(before, texts[0], after)


def test_tools_that_are_not_json_are_rendered_every_time_with_the_same_ids(tokenizer):
    class Opaque:
        def __str__(self):
            return "opaque"

    tools = [{"type": "function", "function": {"name": "f", "description": Opaque(), "parameters": {}}}]
    chat = ChatFormat(tokenizer)
    assert chat_module._prompt_key("x", tools, ()) is None
    renders = counting(chat)
    first = chat.prompt_ids("x", tools)
    once = renders[0]
    assert chat.prompt_ids("x", tools) == first
    assert renders[0] == 2 * once
