"""Each chat format family parses its models' turns into content, reasoning and tool calls, and streaming (one
character or one token at a time) gives exactly the whole-text parse; malformed and cut calls become errors."""

from __future__ import annotations

import random

import pytest

from agentrl.chat.hermes import HermesFamily, parse_tool_calls
from agentrl.chat.registry import resolve
from agentrl.chat.turn import ParsedTurn, TurnDelta
from agentrl.env.tool_calls import parse_tool_calls as env_parse_tool_calls
from tests.unit.chat_fixtures import FAMILIES, MALFORMED, TOOLS, WRITTEN, codec

CASES = [(family, text, expected) for family in FAMILIES for text, expected in WRITTEN[family]]
CASE_IDS = [f"{family}-{i}" for family in FAMILIES for i in range(len(WRITTEN[family]))]


def stream_text(family: str, pieces, in_reasoning=False) -> tuple[list[TurnDelta], ParsedTurn]:
    scanner = resolve(family)().stream(tools=TOOLS, in_reasoning=in_reasoning)
    deltas = [scanner.feed(piece) for piece in pieces]
    last, turn = scanner.finish()
    return [*deltas, last], turn


def assert_deltas_join_to(deltas: list[TurnDelta], turn: ParsedTurn) -> None:
    assert "".join(d.content for d in deltas) == turn.content
    assert "".join(d.reasoning for d in deltas) == turn.reasoning
    assert [c for d in deltas for c in d.calls] == turn.calls
    assert [e for d in deltas for e in d.errors] == turn.errors


@pytest.mark.parametrize(("family", "text", "expected"), CASES, ids=CASE_IDS)
def test_a_turn_as_the_model_writes_it_parses(family, text, expected):
    assert resolve(family)().parse(text, tools=TOOLS) == expected


@pytest.mark.parametrize(("family", "text", "expected"), CASES, ids=CASE_IDS)
def test_streaming_one_character_at_a_time_gives_the_whole_parse(family, text, expected):
    deltas, streamed = stream_text(family, list(text))
    assert streamed == expected
    assert_deltas_join_to(deltas, streamed)
    assert len([d for d in deltas if d.content or d.reasoning]) > 1 or not (expected.content or expected.reasoning)


@pytest.mark.parametrize(("family", "text", "expected"), CASES, ids=CASE_IDS)
def test_streaming_one_token_at_a_time_gives_the_whole_parse(family, text, expected):
    chat = codec(family)
    ids = chat.encode(text)
    if ids[-1] not in chat.stop_ids:  # as the engine returns a turn: its end token last
        ids.append(chat.stop_ids[0])
    stream = chat.stream(tools=TOOLS)
    deltas = [stream.feed([token]) for token in ids]
    last, streamed = stream.finish()
    assert streamed == expected == chat.parse_ids(ids, tools=TOOLS)
    assert_deltas_join_to([*deltas, last], streamed)


@pytest.mark.parametrize(("family", "text", "expected"), CASES, ids=CASE_IDS)
def test_streaming_ids_in_runs_of_any_length_gives_the_whole_parse(family, text, expected):
    """Runs of 1-5 ids a feed (numpy ids among them), characters split across ids before and after the turn's text,
    two streams of one codec side by side (their lane tables shared): each gives the whole parse, and the lane's
    table took the plain ids."""
    import numpy as np

    chat = codec(family)
    ids = chat.encode(f"{text} 🤔数学" if not expected.calls else text)
    expected = chat.parse_ids(ids, tools=TOOLS)
    rng = random.Random(f"{family}{text}")
    streams = [chat.stream(tools=TOOLS), chat.stream(tools=TOOLS)]
    fed = [[] for _ in streams]
    at = [0, 0]
    while min(at) < len(ids):
        which = rng.randrange(2) if max(at) < len(ids) else at.index(min(at))
        size = rng.randint(1, 5)
        run = ids[at[which] : at[which] + size]
        fed[which].append(streams[which].feed([np.int64(i) for i in run] if rng.random() < 0.3 else run))
        at[which] += len(run)
    for stream, deltas in zip(streams, fed, strict=True):
        last, streamed = stream.finish()
        assert streamed == expected
        assert_deltas_join_to([*deltas, last], streamed)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_streamed_token_on_a_lane_takes_the_tables_delta_without_a_scan(family):
    """Content that goes on, one id a feed: after its first ids, each id is looked up in the lane table of the
    content mode (the same delta object for the same id, no scanner call) and the turn is still the whole parse."""
    chat = codec(family)
    head = {"harmony": "<|channel|>final<|message|>"}.get(family, "")
    ids = chat.encode(head + "It is 5. It is 5. It is 5. It is 5.")
    stream = chat.stream(tools=TOOLS)
    deltas = [stream.feed([token]) for token in ids]
    last, turn = stream.finish()
    assert turn == chat.parse_ids(ids, tools=TOOLS) and turn.content == "It is 5. It is 5. It is 5. It is 5."
    assert_deltas_join_to([*deltas, last], turn)
    half = len(ids) // 2
    own = [deltas[i].content == chat.decode([ids[i]]) for i in range(len(ids))]  # the id's text, sent as it came
    repeated = [i for i in range(half, len(ids)) if ids[i] in ids[half:i] and own[i]]
    assert repeated and all(deltas[i] is deltas[ids.index(ids[i], half)] for i in repeated)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_malformed_call_becomes_an_error_the_model_can_act_on(family):
    text, words = MALFORMED[family]
    parsed = resolve(family)().parse(text, tools=TOOLS)
    assert parsed.calls == [] and len(parsed.errors) == 1, parsed
    assert words in parsed.errors[0]
    deltas, streamed = stream_text(family, list(text))
    assert streamed == parsed
    assert_deltas_join_to(deltas, streamed)


CALL_CASES = [(f, t, e) for f, t, e in CASES if e.calls]
CALL_CASE_IDS = [f"{f}-{i}-{e.calls[-1].name}" for i, (f, _, e) in enumerate(CALL_CASES)]


@pytest.mark.parametrize(("family", "text", "expected"), CALL_CASES, ids=CALL_CASE_IDS)
def test_a_call_cut_by_the_token_limit_is_an_error_and_its_text_is_kept(family, text, expected):
    last_value = str(list(expected.calls[-1].arguments.values())[-1])
    cut = text[: text.rindex(last_value)]  # inside the last call's arguments
    parsed = resolve(family)().parse(cut, tools=TOOLS)
    assert parsed.calls == expected.calls[:-1], parsed
    assert len(parsed.errors) == 1 and parsed.errors[0], parsed
    assert cut.rstrip()[-12:].strip() in parsed.content  # nothing the model wrote is lost
    deltas, streamed = stream_text(family, list(cut))
    assert streamed == parsed
    assert_deltas_join_to(deltas, streamed)


@pytest.mark.parametrize(("family", "text", "expected"), CASES, ids=CASE_IDS)
def test_every_prefix_of_a_turn_parses_the_same_whole_and_streamed(family, text, expected):
    """What a stream shows before the end never contradicts the end: a prefix's calls are the turn's first calls."""
    family_parser = resolve(family)()
    for end in range(0, len(text) + 1, 3):
        whole = family_parser.parse(text[:end], tools=TOOLS)
        _, streamed = stream_text(family, [text[:end][i : i + 2] for i in range(0, end, 2)])
        assert streamed == whole, text[:end]
        complete = [c for c in whole.calls if c in expected.calls]
        assert complete == expected.calls[: len(complete)]


@pytest.mark.parametrize("family", FAMILIES)
def test_random_token_soup_never_raises_and_streams_as_it_parses(family):
    """Random ids, markup tokens often among them (what an untrained model writes): the parse never raises, and
    one id at a time gives the whole parse."""
    chat = codec(family)
    markup = [i for token, i in chat.tokenizer.get_added_vocab().items() if i not in chat.stop_ids]
    plain = chat.encode('{"name": "add", "arguments": {"a": 2}} x [ ] ``` json\n to=functions.add')
    rng = random.Random(family)
    for _ in range(60):
        ids = [rng.choice(markup) if rng.random() < 0.3 else rng.choice(plain) for _ in range(40)]
        whole = chat.parse_ids(ids, tools=TOOLS)
        stream = chat.stream(tools=TOOLS)
        deltas = [stream.feed([token]) for token in ids]
        last, streamed = stream.finish()
        assert streamed == whole
        assert_deltas_join_to([*deltas, last], streamed)


def test_the_hermes_family_parses_as_tool_env_always_has():
    assert env_parse_tool_calls is parse_tool_calls
    assert HermesFamily().parse("x") == parse_tool_calls("x")


def test_hermes_streaming_agrees_with_the_tool_env_parser_on_random_turns():
    pieces = [
        "<tool_call>",
        "</tool_call>",
        '{"name": "add", "arguments": {"a": 2, "b": 3}}',
        '{"name": "x"}',
        "{bad",
        '"',
        " ",
        "\n",
        "It is 5.",
        "<tool_",
        "call>",
    ]
    rng = random.Random(0)
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        expected = parse_tool_calls(text)
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 4)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        deltas, streamed = stream_text("hermes", chunks)
        assert streamed == expected, text
        assert_deltas_join_to(deltas, streamed)


@pytest.mark.parametrize("family", ["qwen3", "deepseek_r1", "glm45"])
def test_a_turn_whose_prompt_opened_reasoning_starts_in_reasoning(family):
    parser = resolve(family)()
    parsed = parser.parse("Add them.\n</think>\n\nIt is 5.", in_reasoning=True)
    assert (parsed.reasoning, parsed.content) == ("Add them.", "It is 5.")
    cut = parser.parse("Still thinking about", in_reasoning=True)  # cut by the length limit mid-reasoning
    assert (cut.reasoning, cut.content, cut.errors) == ("Still thinking about", "", [])


def test_a_prompt_that_opens_reasoning_is_seen_from_its_ids():
    chat = codec("deepseek_r1")
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 3?"}])
    output = [*chat.encode("Add them.\n</think>\n\nIt is 5."), chat.stop_ids[0]]
    assert chat.opens_reasoning(prompt)
    assert chat.parse_ids(output, prompt_ids=prompt) == ParsedTurn(content="It is 5.", reasoning="Add them.")
