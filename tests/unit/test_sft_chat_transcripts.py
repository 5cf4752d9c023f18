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
    head, tools = ChatTranscripts(chat).loop_chat.tools_placed(messages[:1], [ADD])
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
    # after tool outputs R1's prompt opens no <think> and its template drops the reasoning: the model opens it itself
    assert not chat.opens_reasoning(out.tokens[: second[0]])
    assert (answer.reasoning, answer.content) == ("The tool said 5.", "It is 5.")
    # a turn without reasoning still closes the reasoning the prompt opened
    plain = ChatTranscripts(chat, keep_rewritten=True)(transcript(False, arguments_as_text=True), [ADD])
    first = trained_spans(plain.tokens, plain.loss_mask)[0]
    assert chat.decode(plain.tokens[first[0] : first[1]]).startswith("</think>\n\n")


@pytest.mark.parametrize("family", ["qwen3", "deepseek_r1"])
def test_reasoning_is_masked_where_chat_train_reasoning_is_false(family):
    chat = codec(family)
    messages = transcript(True, arguments_as_text=chat.family.arguments_as_text)
    trained = ChatTranscripts(chat, keep_rewritten=True)(messages, [ADD])
    masked = ChatTranscripts(chat, keep_rewritten=True, train_reasoning=False)(messages, [ADD])
    assert masked.tokens == trained.tokens
    dropped = [t for t, a, b in zip(trained.tokens, trained.loss_mask, masked.loss_mask, strict=True) if a and not b]
    assert "Add them." in chat.decode(dropped) and "The tool said 5." in chat.decode(dropped)
    kept = chat.decode([t for t, m in zip(masked.tokens, masked.loss_mask, strict=True) if m])
    assert "Add them" not in kept and "It is 5." in kept and '"a": 2' in kept


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
    assert (
        "is written: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function" in prompt
    )  # the family's call format, not Hermes'


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
    rows = [dress({"messages": transcript(False)}, rng, "random", reasoning=family == "qwen3") for _ in range(3)]
    ids = [row["messages"][1]["tool_calls"][0]["id"] for row in rows]
    assert all(len(i) == 9 and i.isalnum() for i in ids) and len(set(ids)) == 3
    counted = dress({"messages": transcript(False) + transcript(False)[1:]}, rng, "counter", reasoning=False)
    assert [m["tool_calls"][0]["id"] for m in counted["messages"] if m.get("tool_calls")] == ["000000001", "000000002"]
    assert [m["tool_call_id"] for m in counted["messages"] if m["role"] == "tool"] == ["000000001", "000000002"]
    assert [row["messages"][2]["tool_call_id"] for row in rows] == ids
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    transcripts = read_transcripts(path)
    if family == "qwen3":
        assert "I will call add." in texts_of(transcripts)  # the tokenizer of a tiny model is trained on reasoning too
    packed = tokenize_all(transcripts, ChatTranscripts(codec(family)), max_seq_len=512)
    assert len(packed) == 3 and packed.loss_mask.sum() > 0


@pytest.mark.parametrize("family", ["qwen3", "llama3", "mistral", "glm45"])
def test_a_calculator_demonstration_tokenizes_to_the_env_loops_episode_of_the_same_turns(family):
    """The transcript's trained spans, generated by an engine in the real agent loop against the calculator env
    (parsing in the family's format), give the episode the transcript tokenized to: the same ids, the same mask."""
    import asyncio

    import numpy as np

    from agentrl.engine.base import SamplingParams
    from agentrl.env.client import LocalEnvClient
    from agentrl.env.host import EnvHost
    from agentrl.models.chat_format import ChatFormat
    from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
    from agentrl.trajectory import Episode
    from envs.calculator.demos import demonstration
    from envs.calculator.env import CalculatorEnv
    from tests.unit.test_agent_loop import ScriptedEngine

    kwargs = {"list_tools": False}
    rng = np.random.default_rng(0)
    played, reward = demonstration(CalculatorEnv(**kwargs), 7, "tool", rng)
    assert reward == 1
    transcript = dress(played, rng, "counter", reasoning=family in REASONING_FAMILIES)
    chat = codec(family)
    out = ChatTranscripts(chat)(transcript["messages"], transcript.get("tools"))
    turns = [out.tokens[start:end] for start, end in trained_spans(out.tokens, out.loss_mask)]
    loop_chat = ChatFormat(chat.tokenizer, codec=chat)
    episode = Episode(group=0, task_seed=7)
    sampling = SamplingParams(max_new_tokens=200, stop_token_ids=loop_chat.stop_ids)
    client = LocalEnvClient(EnvHost("calculator", kwargs, chat_format=family))
    engine = ScriptedEngine(turns, turns[0][-1])  # each turn ends with the family's stop id
    rules = EpisodeRules(sampling, EpisodeLimits(len(turns), 200, 2000))
    asyncio.run(run_episode(engine, client, loop_chat, rules, episode, 0))
    assert episode.finish == "terminated" and episode.success and episode.turns == len(turns) == 2
    assert episode.tokens == out.tokens
    assert episode.loss_mask == out.loss_mask


@pytest.mark.parametrize("family", ["qwen3", "llama3", "mistral"])
def test_the_three_formats_launch_configs_load_and_name_their_family(family):
    from pathlib import Path

    from agentrl.config import load_config
    from agentrl.sft.config import load_sft_config

    root = Path(__file__).resolve().parents[2] / "launch" / "configs"
    sft = load_sft_config(root / f"calculator_{family}_sft.yaml")
    assert sft.model.tiny.family == family
    assert Path(sft.sft.train).name in {"calculator_chat_sft_train.jsonl", "calculator_think_sft_train.jsonl"}
    final = f"runs/calculator_{family}_sft/final"
    for route in ("rl", "gateway"):
        rl = load_config(root / f"calculator_{family}_{route}.yaml")
        assert rl.model.path == final and rl.eval.before_train
        assert rl.agent.enabled == (route == "gateway")


def test_a_tiny_model_of_a_family_is_built_where_model_tiny_names_it(tmp_path):
    from agentrl.chat.codec import load_codec
    from agentrl.config.schema import ModelConfig
    from agentrl.models.loading import ensure_model

    model = ModelConfig(path=str(tmp_path / "m"), tiny={"family": "mistral", "hidden_size": 16, "num_layers": 1})
    ensure_model(model, lambda: ["What is 2 + 3?"])
    assert load_codec(tmp_path / "m").family.name == "mistral"
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "mistral"
    ensure_model(model, lambda: [])  # built: checked, not rebuilt
    with pytest.raises(UserError, match=r"built from another model.tiny .*family: mistral there, llama3 in the config"):
        ensure_model(ModelConfig(path=model.path, tiny={**model.tiny.model_dump(), "family": "llama3"}), list)
    with pytest.raises(ValueError, match="no tiny test model for chat format 'nope'; families with one: hermes"):
        ModelConfig(path=model.path, tiny={"family": "nope"})
