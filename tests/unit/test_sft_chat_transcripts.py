"""SFT transcripts in each family's chat format: the ids and loss mask an episode of that family builds, its turns as
the template writes them (reasoning included) and parsed back to the transcript's messages; R1's reasoning kept as
the model writes it; the Hermes format keeps agentrl's own transcript path."""

from __future__ import annotations

import json

import pytest

from agentrl.errors import UserError
from agentrl.sft.chat_transcripts import ChatTranscripts, transcript_tokenizer
from agentrl.sft.data import read_transcripts, texts_of, tokenize_all
from agentrl.sft.demos import dress
from agentrl.sft.transcripts import TranscriptError, TranscriptTokenizer
from tests.unit.chat_fixtures import ADD, FAMILIES, codec, tokenizer

REASONING_FAMILIES = ("qwen3", "harmony", "deepseek_r1", "glm45")
CALL_ID = "abcDEF123"  # 9 characters: Mistral's template refuses others


def transcript(reasoning: bool, key: str = "reasoning_content", arguments_as_text: bool = False) -> list[dict]:
    """user, a call of `add`, its result, the answer: as a Hugging Face / OpenAI transcript writes it."""
    arguments = {"a": 2, "b": 3}
    call = {"id": CALL_ID, "type": "function", "function": {"name": "add", "arguments": arguments}}
    if arguments_as_text:
        call["function"]["arguments"] = json.dumps(arguments)
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": CALL_ID, "name": "add", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
    ]
    if reasoning:
        messages[1][key], messages[3][key] = "Add them.", "The tool said 5."
    return messages


def trained_spans(ids: list[int], mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("hermes", "deepseek_r1", "harmony")])
def test_a_transcripts_turns_are_trained_as_the_template_writes_them_and_parse_back(family):
    chat = codec(family)
    reasoning = family in REASONING_FAMILIES
    messages = transcript(reasoning, arguments_as_text=chat.family.arguments_as_text)
    out = ChatTranscripts(chat)(messages, [ADD])
    assert len(out.tokens) == len(out.loss_mask)
    spans = trained_spans(out.tokens, out.loss_mask)
    assert len(spans) == 2  # the two assistant turns, nothing else
    first, second = spans
    # what precedes the first turn is its prompt, as the agent loop renders it (tools as system text where the
    # template does not render them)
    head, tools = messages[:1], [ADD]
    if not chat.probe().renders_tools:
        head, tools = ChatTranscripts(chat).tools_in_system_message(head, tools), None
    assert out.tokens[: first[0]] == chat.prompt_ids(head, tools)
    call_turn = chat.parse_ids(out.tokens[first[0] : first[1]], prompt_ids=out.tokens[: first[0]], tools=[ADD])
    assert [(c.name, c.arguments) for c in call_turn.calls] == [("add", {"a": 2, "b": 3})]
    assert not call_turn.errors
    answer = chat.parse_ids(out.tokens[second[0] : second[1]], prompt_ids=out.tokens[: second[0]], tools=[ADD])
    assert answer.content == "It is 5." and not answer.calls
    if reasoning:
        assert (call_turn.reasoning, answer.reasoning) == ("Add them.", "The tool said 5.")
    # each turn ends with a stop id: generation would end there
    assert out.tokens[first[1] - 1] in chat.stop_ids and out.tokens[second[1] - 1] in chat.stop_ids


@pytest.mark.parametrize("family", ["qwen3", "llama3", "mistral", "glm45"])
def test_a_transcripts_ids_are_the_whole_conversation_rendered_where_the_template_is_append_only(family):
    chat = codec(family)
    messages = transcript(family in REASONING_FAMILIES, arguments_as_text=chat.family.arguments_as_text)
    out = ChatTranscripts(chat)(messages, [ADD])
    whole = chat.encode(chat.render(messages, [ADD], generation_prompt=False))
    end = chat.turn_end(chat.decode(whole)) if chat.family.closers else None
    expected = chat.encode(chat.decode(whole)[:end]) if end is not None else whole
    if not chat.family.closers:  # GLM: the model ends its last turn by writing the next role, <|user|>
        expected = [*expected, chat.tokenizer.convert_tokens_to_ids("<|user|>")]
    assert out.tokens == expected


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning", "thinking"])
@pytest.mark.parametrize("family", ["qwen3", "harmony"])
def test_reasoning_under_any_common_key_goes_where_the_family_reads_it(family, key):
    chat = codec(family)
    out = ChatTranscripts(chat)(transcript(True, key)[:2], [ADD])  # the call turn (harmony: see below)
    first = trained_spans(out.tokens, out.loss_mask)[0]
    turn = chat.parse_ids(out.tokens[first[0] : first[1]], prompt_ids=out.tokens[: first[0]], tools=[ADD])
    assert turn.reasoning == "Add them."


@pytest.mark.parametrize("family", ["llama3", "deepseek_v3"])
def test_reasoning_for_a_family_that_writes_none_is_an_error_naming_it(family):
    with pytest.raises(TranscriptError, match=rf"message 1 has reasoning \(reasoning_content\), but the {family}"):
        ChatTranscripts(codec(family))(transcript(True), [ADD])


def test_r1_transcripts_need_the_turns_kept_as_the_model_writes_them():
    chat = codec("deepseek_r1")
    messages = transcript(True, arguments_as_text=True)
    with pytest.raises(TranscriptError, match=r"deepseek_r1 transcript: .*chat.rewritten=keep"):
        ChatTranscripts(chat)(messages, [ADD])
    out = ChatTranscripts(chat, keep_rewritten=True)(messages, [ADD])
    first, second = trained_spans(out.tokens, out.loss_mask)
    prompt = out.tokens[: first[0]]
    assert chat.opens_reasoning(prompt)  # the prompt ends with <think>: the model writes its reasoning next
    assert chat.decode(out.tokens[first[0] : first[1]]).startswith("Add them.\n</think>\n\n<｜tool▁calls▁begin｜>")
    call_turn = chat.parse_ids(out.tokens[first[0] : first[1]], prompt_ids=prompt, tools=[ADD])
    assert (call_turn.reasoning, [c.arguments for c in call_turn.calls]) == ("Add them.", [{"a": 2, "b": 3}])
    answer = chat.parse_ids(out.tokens[second[0] : second[1]], prompt_ids=out.tokens[: second[0]], tools=[ADD])
    assert answer.content == "It is 5."
    # a turn without reasoning still closes the reasoning the prompt opened
    plain = ChatTranscripts(chat, keep_rewritten=True)(transcript(False, arguments_as_text=True), [ADD])
    first = trained_spans(plain.tokens, plain.loss_mask)[0]
    assert chat.decode(plain.tokens[first[0] : first[1]]).startswith("</think>\n\n")


def test_a_harmony_answer_after_calls_with_analysis_is_refused_naming_the_rewrite():
    """harmony's template drops the calls' analysis once a final answer follows, so the answer is not written after
    its own prompt: refused (a transcript that is one call turn, or has no analysis, tokenizes)."""
    chat = codec("harmony")
    with pytest.raises(TranscriptError, match="harmony transcript: turn 3 is not written after its own generation"):
        ChatTranscripts(chat, keep_rewritten=True)(transcript(True), [ADD])
    out = ChatTranscripts(chat)(transcript(False), [ADD])
    assert len(trained_spans(out.tokens, out.loss_mask)) == 2


def test_a_qwen3_user_follow_up_is_refused_unless_turns_are_kept_as_generated():
    chat = codec("qwen3")
    messages = [*transcript(True), {"role": "user", "content": "And 4 + 3?"}, {"role": "assistant", "content": "7"}]
    with pytest.raises(TranscriptError, match=r"qwen3 transcript: .*renders the history differently"):
        ChatTranscripts(chat)(messages, [ADD])
    out = ChatTranscripts(chat, keep_rewritten=True)(messages, [ADD])
    assert len(trained_spans(out.tokens, out.loss_mask)) == 3
    assert "<think>\nThe tool said 5.\n</think>" in chat.decode(out.tokens)  # kept where the model wrote it


def test_mistral_call_ids_the_template_refuses_are_an_error_naming_them():
    messages = transcript(False)
    messages[1]["tool_calls"][0]["id"] = "call_1"
    with pytest.raises(TranscriptError, match="Tool call IDs should be alphanumeric strings with length 9"):
        ChatTranscripts(codec("mistral"))(messages, [ADD])


def test_tools_a_template_does_not_render_go_to_the_system_message_as_the_agent_loop_lists_them():
    chat = codec("deepseek_v3")
    assert not chat.probe().renders_tools
    out = ChatTranscripts(chat, "Be brief.")(transcript(False, arguments_as_text=True), [ADD])
    prompt = chat.decode(out.tokens[: out.loss_mask.index(1)])
    assert "Be brief.\n\nYou can call these tools:\n- add: Add two integers." in prompt


def test_the_hermes_format_keeps_agentrls_own_transcript_path():
    from agentrl.models.tiny import build_tokenizer

    assert isinstance(transcript_tokenizer(build_tokenizer(["What is 2 + 3?"], vocab_size=160)), TranscriptTokenizer)
    assert isinstance(transcript_tokenizer(tokenizer("hermes")), TranscriptTokenizer)
    assert isinstance(transcript_tokenizer(tokenizer("llama3")), ChatTranscripts)
    assert isinstance(transcript_tokenizer(tokenizer("hermes"), chat_format="qwen3"), ChatTranscripts)
    with pytest.raises(UserError, match="none of the llama3 end-of-turn tokens"):
        transcript_tokenizer(tokenizer("hermes"), chat_format="llama3")


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_dressed_demonstrations_read_and_tokenize_for_their_family(family, tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    rows = [dress({"messages": transcript(False)}, rng, call_ids=True, reasoning=family == "qwen3") for _ in range(3)]
    ids = [row["messages"][1]["tool_calls"][0]["id"] for row in rows]
    assert all(len(i) == 9 and i.isalnum() for i in ids) and len(set(ids)) == 3
    assert [row["messages"][2]["tool_call_id"] for row in rows] == ids
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    transcripts = read_transcripts(path)
    if family == "qwen3":
        assert "I will call add." in texts_of(transcripts)  # the tokenizer of a tiny model is trained on reasoning too
    packed = tokenize_all(transcripts, ChatTranscripts(codec(family)), max_seq_len=512)
    assert len(packed) == 3 and packed.loss_mask.sum() > 0
