"""agentrl serve's pure parts: prompt rendering, tool-call replies, stop strings, what a stream may send."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from agentrl.engine.base import GenerateOutput
from agentrl.models.chat_format import tools_as_text
from agentrl.serve.completions import Completions
from agentrl.serve.protocol import APIError, ChatMessage
from agentrl.serve.render import ChatRenderer, cut_at_stop, streamable_prefix
from agentrl.serve.reply import ReplyReader
from tests.unit.serve_server import build_serve_model

CALC = {
    "type": "function",
    "function": {"name": "calculator", "description": "adds", "parameters": {"type": "object", "properties": {}}},
}
CALL_TEXT = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from agentrl.models.loading import load_tokenizer

    return load_tokenizer(str(build_serve_model(tmp_path_factory.mktemp("serve") / "tiny")))


class FixedEngine:
    """Pure unit tests of reply parsing only: answers every prompt with the same token ids."""

    weight_version = 7

    def __init__(self, ids: list[int]):
        self.ids = ids

    def allow_grammars(self, tokenizer) -> bool:
        return False

    async def generate(self, input_ids, sampling):
        ids = np.asarray(self.ids, dtype=np.int64)
        return GenerateOutput(ids, np.full(len(ids), -0.5, dtype=np.float32), "stop", self.weight_version)


def test_prompt_ids_are_the_templates_text_tokenized(tokenizer):
    renderer = ChatRenderer(tokenizer)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2 + 3?"}]
    expected = tokenizer(
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )["input_ids"]
    assert renderer.prompt_ids([ChatMessage(**m) for m in messages]) == expected


def test_tools_go_into_the_system_message_when_the_template_ignores_them(tokenizer):
    renderer = ChatRenderer(tokenizer)
    assert not renderer.renders_tools  # the tiny template has no tools block
    text = renderer.text(renderer.prompt_ids([ChatMessage(role="user", content="hi")], [CALC]))
    assert tools_as_text([CALC]) in text
    assert text.index("calculator") < text.index("hi")


def test_an_assistant_tool_call_is_rendered_as_the_model_writes_it(tokenizer):
    renderer = ChatRenderer(tokenizer)
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1"}'}}
    messages = [
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="assistant", content=None, tool_calls=[call]),
        ChatMessage(role="tool", content="1", tool_call_id="c1"),
    ]
    text = renderer.text(renderer.prompt_ids(messages, [CALC]))
    assert '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>' in text


def test_bad_tool_call_arguments_are_refused(tokenizer):
    call = {"type": "function", "function": {"name": "calculator", "arguments": "{not json"}}
    with pytest.raises(APIError, match="not JSON"):
        ChatRenderer(tokenizer).prompt_ids([ChatMessage(role="assistant", content="", tool_calls=[call])])


def test_a_reply_parses_hermes_calls_only_when_tools_were_offered(tokenizer):
    renderer = ChatRenderer(tokenizer)

    def read(text, with_tools):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        reply = ReplyReader(renderer, None, [CALC], with_tools).read(ids)
        return reply.message, reply.calls

    message, calls = read("let me add " + CALL_TEXT, with_tools=True)
    assert calls and message["content"] == "let me add"
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2 + 3"}
    assert read(CALL_TEXT, with_tools=False) == ({"role": "assistant", "content": CALL_TEXT}, False)
    broken = "<tool_call>{not json}</tool_call>"
    assert read(broken, with_tools=True) == ({"role": "assistant", "content": broken}, False)


def test_chat_turns_engine_tokens_with_a_call_into_tool_calls(tokenizer):
    from agentrl.serve.generation import LocalBackend

    ids = tokenizer(CALL_TEXT, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    records = []
    server = Completions(LocalBackend(FixedEngine(ids), tokenizer), tokenizer, "tiny", 1024, on_call=records.append)
    payload = {"model": "tiny", "messages": [{"role": "user", "content": "2 + 3?"}], "tools": [CALC]}
    response = asyncio.run(server.chat(payload))
    choice = response["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"expression": "2 + 3"}
    (record,) = records
    assert record.output_ids == ids and record.weight_version == 7 and record.finish_reason == "stop"
    assert record.prompt_ids == server.renderer.prompt_ids([ChatMessage(role="user", content="2 + 3?")], [CALC])
    no_tools = asyncio.run(server.chat({**payload, "tool_choice": "none"}))
    assert no_tools["choices"][0]["finish_reason"] == "stop"
    assert no_tools["choices"][0]["message"]["content"] == CALL_TEXT


def test_cut_at_stop_takes_the_earliest_stop():
    assert cut_at_stop("abc STOP def END", ("END", "STOP")) == ("abc ", True)
    assert cut_at_stop("abc", ("x",)) == ("abc", False)


def test_a_completion_stream_holds_back_what_may_become_a_stop_string():
    assert streamable_prefix("hello ST", ("STOP",), final=False) == "hello "
    assert streamable_prefix("hello STOP more", ("STOP",), final=False) == "hello "
    assert streamable_prefix("see <tool_c", (), final=False) == "see <tool_c"
    assert streamable_prefix("half \ufffd", (), final=False) == "half "
    assert streamable_prefix("hello ST", ("STOP",), final=True) == "hello ST"


def test_parallel_tool_calls_false_keeps_the_first_call_under_auto(tokenizer):
    from agentrl.serve.generation import LocalBackend

    second = CALL_TEXT.replace("2 + 3", "4 * 5")
    ids = tokenizer(CALL_TEXT + "\n" + second, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    server = Completions(LocalBackend(FixedEngine(ids), tokenizer), tokenizer, "tiny", 1024)
    payload = {"model": "tiny", "messages": [{"role": "user", "content": "2 + 3?"}], "tools": [CALC]}
    both = asyncio.run(server.chat(payload))["choices"][0]["message"]["tool_calls"]
    assert [json.loads(call["function"]["arguments"])["expression"] for call in both] == ["2 + 3", "4 * 5"]
    (one,) = asyncio.run(server.chat({**payload, "parallel_tool_calls": False}))["choices"][0]["message"]["tool_calls"]
    assert json.loads(one["function"]["arguments"]) == {"expression": "2 + 3"}
