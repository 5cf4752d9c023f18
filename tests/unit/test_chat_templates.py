"""Exact tokens across turns, per family: a multi-turn tool conversation built the way the agent loop builds it
(the prompt, each turn's generated ids kept as they are, then the template's ids for the tool results or the next
user message) equals `apply_chat_template` on the whole conversation, token for token, wherever the template is
append-only; where it is not, the probe says so and the continuation refuses (or, asked to, keeps the turn)."""

from __future__ import annotations

import pytest

from agentrl.chat.codec import ChatTemplateError, NotAppendOnly
from agentrl.chat.turn import ParsedTurn, ToolCall
from tests.unit.chat_fixtures import FAMILIES, TOOLS, codec

# (family, template kwargs) -> whether the template is append-only after tool results / after a user message,
# whether it writes every turn right after its own generation prompt, and whether it does so for call turns (a
# tool loop has no other). The probe must find the first three, and the token test below must agree with them.
THINKING_OFF = {"enable_thinking": False}
VARIANTS = [(family, {}) for family in FAMILIES] + [("qwen3", THINKING_OFF), ("glm45", THINKING_OFF)]
VARIANT_IDS = [f"{family}{'-thinking-off' if kwargs else ''}" for family, kwargs in VARIANTS]
EXPECTED = {
    "hermes": (True, True, True, True),
    "qwen3": (True, False, True, True),  # earlier reasoning dropped after a new user message
    "qwen3-thinking-off": (False, False, True, True),  # the prompt's empty think block is not kept in the history
    "llama3": (True, True, True, True),
    "mistral": (True, False, True, True),  # the tools and the system message move to the last user message
    "harmony": (True, False, False, True),  # <|return|> becomes <|end|>; a final answer drops the calls' analysis
    "deepseek_v3": (True, True, True, True),
    "deepseek_r1": (True, True, False, False),  # the prompt's <think> and the reasoning are never written back
    "glm45": (True, False, True, True),  # earlier reasoning dropped after a new user message
    "glm45-thinking-off": (True, True, True, True),
}


def conversation(chat, calls_per_turn: int, follow_up: bool, reasoning: bool) -> list[dict]:
    """system, user, a call turn, its results, (a second call turn and its results | an answer and a user message)."""
    family = chat.family

    def call_turn(n):
        calls = [ToolCall("add", {"a": n + i, "b": 3}) for i in range(calls_per_turn)]
        message = family.assistant_message(ParsedTurn(calls=calls, reasoning="Add them." if reasoning else ""))
        results = [family.tool_message(c["id"], "add", str(n + i + 3)) for i, c in enumerate(message["tool_calls"])]
        return [message, *results]

    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"}]
    messages += call_turn(2)
    if follow_up:
        answer = ParsedTurn(content="It is 5.", reasoning="The tool said 5." if reasoning else "")
        messages += [family.assistant_message(answer), {"role": "user", "content": "And 4 + 3?"}]
    else:
        messages += call_turn(4)
    return messages


def incremental_ids(chat, messages: list[dict], keep_rewritten=False):
    """The ids as an episode builds them, each turn's generated ids (the template's own text for the turn,
    tokenized alone, as a model that writes exactly its format would generate it), and where each turn starts;
    step by step here, as the agent loop would, to check `ChatCodec.conversation_ids` against."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    ids = chat.prompt_ids(messages[: turns[0]], TOOLS)
    generated, starts = [], []
    for k, index in enumerate(turns):
        output = chat.encode(chat.written_turn(messages, index, TOOLS))
        if not chat.family.closers:  # GLM: the model stops by writing the next message's role
            role = "<|observation|>" if messages[index + 1]["role"] == "tool" else "<|user|>"
            output.append(chat.tokenizer.convert_tokens_to_ids(role))
        generated.append(output)
        starts.append(len(ids))
        ids += output
        following = messages[index + 1 : turns[k + 1] if k + 1 < len(turns) else len(messages)]
        ids += chat.continuation_ids(
            messages[: index + 1], following, TOOLS, ended_with=output[-1], keep_rewritten=keep_rewritten
        )
    conversation, mask = chat.conversation_ids(messages, TOOLS, keep_rewritten=keep_rewritten)
    assert conversation == ids
    trained = [start + j for start, output in zip(starts, generated, strict=True) for j in range(len(output))]
    assert [i for i, m in enumerate(mask) if m] == trained
    return ids, generated, starts


def whole_ids(chat, messages):
    return chat.tokenizer.apply_chat_template(
        messages, tools=TOOLS, tokenize=True, add_generation_prompt=True, return_dict=False, **chat.template_kwargs
    )


@pytest.mark.parametrize(("family", "kwargs"), VARIANTS, ids=VARIANT_IDS)
def test_the_probe_finds_where_a_template_is_append_only(family, kwargs):
    name = VARIANT_IDS[VARIANTS.index((family, kwargs))]
    probe = codec(family, **kwargs).probe()
    after_tool, after_user, keeps, _ = EXPECTED[name]
    found = (probe.append_only_after_tool, probe.append_only_after_user, probe.keeps_generation)
    assert found == (after_tool, after_user, keeps), probe.notes
    assert probe.round_trip and probe.tokens_split_exactly, probe.notes
    assert probe.append_only == (after_tool and after_user and keeps)
    assert bool(probe.notes) == (not probe.append_only or not probe.renders_parallel_calls)


@pytest.mark.parametrize(("family", "kwargs"), VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("follow_up", [False, True], ids=["tool-loop", "user-follow-up"])
def test_turn_by_turn_ids_equal_the_whole_conversations_ids(family, kwargs, follow_up):
    name = VARIANT_IDS[VARIANTS.index((family, kwargs))]
    after_tool, after_user, keeps, keeps_calls = EXPECTED[name]
    chat = codec(family, **kwargs)
    probe = chat.probe()
    messages = conversation(chat, calls_per_turn=1, follow_up=follow_up, reasoning=probe.thinking)
    exact = after_tool and after_user and keeps if follow_up else after_tool and keeps_calls
    if not exact:
        with pytest.raises(NotAppendOnly, match=r"start a new sample|generation prompt"):
            incremental_ids(chat, messages)
        return
    ids, _, _ = incremental_ids(chat, messages)
    assert ids == whole_ids(chat, messages)


@pytest.mark.parametrize("family", ["hermes", "qwen3", "mistral", "deepseek_v3", "glm45"])
def test_parallel_calls_and_their_results_stay_exact(family):
    chat = codec(family)
    assert chat.probe().renders_parallel_calls
    messages = conversation(chat, calls_per_turn=2, follow_up=False, reasoning=chat.probe().thinking)
    ids, generated, _ = incremental_ids(chat, messages)
    assert ids == whole_ids(chat, messages)
    parsed = chat.parse_ids(generated[0], tools=TOOLS)
    assert [c.arguments for c in parsed.calls] == [{"a": 2, "b": 3}, {"a": 3, "b": 3}]


@pytest.mark.parametrize(("family", "kwargs"), VARIANTS, ids=VARIANT_IDS)
def test_a_rewriting_template_can_keep_the_turns_as_generated(family, kwargs):
    """keep_rewritten: the episode keeps every generated id where the model wrote it, and each continuation is the
    template's own text for the new messages (ending in its generation prompt)."""
    chat = codec(family, **kwargs)
    messages = conversation(chat, calls_per_turn=1, follow_up=True, reasoning=chat.probe().thinking)
    try:
        ids, generated, starts = incremental_ids(chat, messages, keep_rewritten=True)
    except ChatTemplateError as error:  # the turn cannot be written after its own prompt (R1, harmony's answer)
        assert "generation prompt" in str(error)
        return
    for output, start in zip(generated, starts, strict=True):
        assert ids[start : start + len(output)] == output
    whole = chat.render(messages, TOOLS, True)
    assert chat.decode(ids).endswith(whole[whole.rindex("And 4 + 3?") :])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_turn_cut_by_the_length_limit_is_closed_with_the_templates_end_token(family):
    chat = codec(family)
    messages = conversation(chat, calls_per_turn=1, follow_up=False, reasoning=False)
    closing = chat.closing_ids(messages[:3], TOOLS)
    if chat.family.closers:
        assert closing and chat.decode(closing) in chat.family.closers
    else:  # GLM: the role token of the next message (in the continuation) closes it
        assert closing == []
        assert chat.decode(chat.continuation_ids(messages[:3], messages[3:4], TOOLS)).startswith("<|observation|>")


def test_a_template_that_raises_is_a_one_line_error_naming_the_family():
    chat = codec("llama3")
    two_calls = chat.assistant_message(ParsedTurn(calls=[ToolCall("add", {"a": 1}), ToolCall("add", {"a": 2})]))
    with pytest.raises(ChatTemplateError, match=r"llama3 chat template refused these messages: .*single tool-calls"):
        chat.prompt_ids([{"role": "user", "content": "x"}, two_calls], TOOLS)


def test_a_qwen3_call_turn_without_reasoning_is_rewritten_once_its_result_follows():
    """Qwen3's template writes an empty think block for the last turn only: a call turn whose reasoning is empty
    loses it once the tool result follows (thinking on: a model that skipped thinking; thinking off: every turn)."""
    chat = codec("qwen3")
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    reply = chat.assistant_message(ParsedTurn(calls=[ToolCall("add", {"a": 2, "b": 3})]))
    assert "<think>\n\n</think>" in chat.written_turn([*messages, reply], 1, TOOLS)
    result = chat.family.tool_message(reply["tool_calls"][0]["id"], "add", "5")
    with pytest.raises(NotAppendOnly, match=r"once a tool message follows"):
        chat.continuation_ids([*messages, reply], [result], TOOLS)
    kept = chat.continuation_ids([*messages, reply], [result], TOOLS, keep_rewritten=True)
    expected = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert chat.decode(kept) == expected
