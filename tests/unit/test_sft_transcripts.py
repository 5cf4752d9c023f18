"""SFT transcripts tokenize to exactly the token ids and loss mask the RL agent loop produces for the same turns."""

import asyncio
import json
import re
import string

import pytest

from agentrl.engine.base import SamplingParams
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.errors import UserError
from agentrl.models.chat_format import ChatFormat
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.sft.data import read_transcripts, tokenize_all
from agentrl.sft.transcripts import TranscriptError, TranscriptTokenizer, assistant_text, episode_shape
from agentrl.trajectory import Episode
from tests.unit.test_agent_loop import ScriptedEngine
from tests.unit.test_tool_episodes import TOOLS_TEMPLATE

RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl.models.tiny import build_tokenizer

    return build_tokenizer([string.printable, "calculator tool_call tool_response expression"], vocab_size=200)


class RecordingClient(LocalEnvClient):
    """The in-process env client, keeping every observation the env returned."""

    def __init__(self, host):
        super().__init__(host)
        self.observations, self.tools = [], None

    def dispatch(self, requests, futures):
        super().dispatch(requests, futures)
        for request, future in zip(requests, futures, strict=True):
            result = future.result()
            if request[0] == "reset":
                self.observations.append(result.value[0])
                self.tools = result.value[2]
            elif request[0] == "step":
                self.observations.append(result.value[0])


def rl_episode(tokenizer, env_id, kwargs, seed, assistant_messages, system_prompt=None):
    """Drive the real agent loop with an engine that emits each assistant message's tokens and the stop token."""
    chat = ChatFormat(tokenizer, system_prompt=system_prompt)
    turns = [
        [*tokenizer(assistant_text(m), add_special_tokens=False)["input_ids"], chat.eos_id] for m in assistant_messages
    ]
    client = RecordingClient(EnvHost(env_id, kwargs))
    episode = Episode(group=0, task_seed=seed)
    sampling = SamplingParams(max_new_tokens=400, stop_token_ids=chat.stop_ids)
    limits = EpisodeLimits(len(turns), 400, 4000)
    asyncio.run(
        run_episode(ScriptedEngine(turns, chat.eos_id), client, chat, EpisodeRules(sampling, limits), episode, 0)
    )
    return episode, client


def transcript_of(client, assistant_messages, system_prompt=None, wrapped_tools=False):
    """The HF transcript of a recorded episode: tool results as `tool` messages, other observations as `user`."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": client.observations[0]})
    for message, observation in zip(assistant_messages, client.observations[1:], strict=True):
        messages.append(message)
        if message.get("tool_calls") and wrapped_tools:
            messages.append({"role": "tool", "content": observation})
        elif message.get("tool_calls"):
            messages += [{"role": "tool", "content": result} for result in RESPONSE.findall(observation)]
        else:
            messages.append({"role": "user", "content": observation})
    return messages


def calls(*expressions):
    return [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": e}}} for e in expressions
    ]


def calculator_turns(answer):
    return [
        {"role": "assistant", "content": "", "tool_calls": calls("1 / 0")},
        {"role": "assistant", "content": "Two at once.", "tool_calls": calls("6 * 7", "2 +")},
        {"role": "assistant", "content": f"The answer is {answer}"},
    ]


@pytest.mark.parametrize("wrapped_tools", [False, True])
def test_tool_transcript_equals_the_rl_episode(tokenizer, wrapped_tools):
    _, info, _ = EnvHost("calculator", {}).handle("reset", "peek", 7, None).value
    turns = calculator_turns(info["answer"])
    episode, client = rl_episode(tokenizer, "calculator", {}, 7, turns)
    assert episode.finish == "terminated" and episode.success and episode.turns == 3
    assert "division by zero" in client.observations[1] and client.observations[2].count("<tool_response>") == 2

    messages = transcript_of(client, turns, wrapped_tools=wrapped_tools)
    roles = ["user", "assistant", "tool", "assistant", "tool", "tool", "assistant", "user"]  # the env's "correct" last
    if wrapped_tools:  # each turn's results as one tool message, already in <tool_response> blocks
        del roles[5]
    assert [m["role"] for m in messages] == roles
    out = TranscriptTokenizer(tokenizer)(messages, client.tools)
    assert out.tokens == episode.tokens
    assert out.loss_mask == episode.loss_mask
    assert sum(out.loss_mask) > 0 and out.loss_mask[: episode.prompt_len] == [0] * episode.prompt_len


def test_tools_arguments_as_json_string_give_the_same_tokens(tokenizer):
    as_dict = {"role": "assistant", "content": "", "tool_calls": calls("6 * 7")}
    as_string = {
        "role": "assistant",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "6 * 7"}'}}
        ],
    }
    assert assistant_text(as_dict) == assistant_text(as_string)
    assert (
        assistant_text(as_dict) == '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
    )


def test_multi_turn_user_observations_with_system_prompt_equal_the_rl_episode(tokenizer):
    _, info, _ = EnvHost("guess_number", {}).handle("reset", "peek", 3, None).value
    secret = info["secret"]
    wrong = [g for g in range(1, 11) if g != secret][:2]
    turns = [{"role": "assistant", "content": str(g)} for g in [*wrong, secret]]
    episode, client = rl_episode(tokenizer, "guess_number", {}, 3, turns, system_prompt="Guess well.")
    assert episode.finish == "terminated" and episode.success

    messages = transcript_of(client, turns, system_prompt="Guess well.")
    out = TranscriptTokenizer(tokenizer)(messages)
    assert (out.tokens, out.loss_mask) == (episode.tokens, episode.loss_mask)
    # No system message in the transcript: sft.system_prompt stands in for it, as env.system_prompt does in RL.
    out = TranscriptTokenizer(tokenizer, default_system_prompt="Guess well.")(messages[1:])
    assert (out.tokens, out.loss_mask) == (episode.tokens, episode.loss_mask)
    # The env's reply after the last turn adds nothing (RL never appends an observation after the last turn).
    assert messages[-1] == {"role": "user", "content": "correct"}
    assert TranscriptTokenizer(tokenizer)(messages[:-1]).tokens == episode.tokens


def test_template_that_renders_tools_gets_the_same_prompt_as_rl():
    from agentrl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer([string.printable, "calculator tool_call tool_response expression"], vocab_size=200)
    tokenizer.chat_template = TOOLS_TEMPLATE
    _, info, _ = EnvHost("calculator", {}).handle("reset", "peek", 11, None).value
    turns = calculator_turns(info["answer"])
    episode, client = rl_episode(tokenizer, "calculator", {}, 11, turns)
    out = TranscriptTokenizer(tokenizer)(transcript_of(client, turns), client.tools)
    assert (out.tokens, out.loss_mask) == (episode.tokens, episode.loss_mask)
    assert "Tools: calculator" in tokenizer.decode(out.tokens)


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        ([{"role": "user", "content": "q"}], "no assistant turn"),
        ([{"role": "assistant", "content": "a"}], "first user message"),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "r"}],
            "made no tool call",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "a"},
            ],
            "user message after a user message",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "d"},
            ],
            "one observation follows each assistant turn",
        ),
        ([{"role": "user", "content": "q"}, {"role": "robot", "content": "a"}], "roles are"),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}],
            "a tool call must look like",
        ),
    ],
)
def test_roles_out_of_order_are_refused(messages, problem):
    with pytest.raises(TranscriptError, match=problem):
        episode_shape(messages)


def test_raw_tool_call_text_is_kept_as_the_model_wrote_it():
    raw = 'Let me compute.<tool_call>\n{"name":"calculator","arguments":{"expression":"6*7"}}\n</tool_call>'
    assert assistant_text({"role": "assistant", "content": raw, "tool_calls": calls("6*7")}) == raw


def test_raw_tool_call_text_allows_tool_messages(tokenizer):
    raw = '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>'
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": raw},
        {"role": "tool", "content": "1"},
        {"role": "assistant", "content": "1"},
    ]
    assert episode_shape(messages).turns[0] == (raw, "<tool_response>\n1\n</tool_response>")


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = json.dumps({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})


def test_bad_lines_are_named_by_file_and_line(tmp_path):
    path = write(tmp_path / "t.jsonl", [GOOD, "", '{"messages": [}'])
    with pytest.raises(UserError, match=rf"{re.escape(str(path))}:3: not valid JSON"):
        read_transcripts(path)
    path = write(tmp_path / "t.jsonl", [GOOD, '{"conversation": []}'])
    with pytest.raises(UserError, match=r't.jsonl:2: no "messages" key \(found: conversation\)'):
        read_transcripts(path)
    bad = {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]}
    path = write(tmp_path / "t.jsonl", [GOOD, GOOD, json.dumps(bad)])
    with pytest.raises(UserError, match=r"t.jsonl:3: message 1 is a tool message after a user message"):
        read_transcripts(path)
    with pytest.raises(UserError, match="does not exist"):
        read_transcripts(tmp_path / "missing.jsonl")


def test_truncation_is_counted_and_empty_results_dropped(tmp_path, tokenizer):
    long_answer = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x " * 200}]}
    long_prompt = {"messages": [{"role": "user", "content": "q " * 200}, {"role": "assistant", "content": "a"}]}
    path = write(tmp_path / "t.jsonl", [GOOD, json.dumps(long_answer), json.dumps(long_prompt)])
    packed = tokenize_all(read_transcripts(path), TranscriptTokenizer(tokenizer), max_seq_len=64)
    assert (len(packed), packed.truncated, packed.dropped) == (2, 2, 1)
    assert max(packed.offsets[1:] - packed.offsets[:-1]) == 64
    assert len(packed.tokens) == len(packed.loss_mask) == packed.offsets[-1]
