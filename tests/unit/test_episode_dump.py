"""Episode dumps: the conversation as Hugging Face chat messages (tool calls and tool outputs included), one
JSON object per episode in run_dir/episodes/step_NNNNNN.jsonl, replaced when a step is redone."""

import asyncio
import json

import pytest

from agentrl.data.episode_dump import drop_dumps_from, episode_record, read_steps, write_step
from agentrl.engine.base import SamplingParams
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.models.chat_format import ChatFormat
from agentrl.models.loading import load_tokenizer
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.rollout.messages import assistant_message, observation_messages
from agentrl.trajectory import Episode
from tests.unit.test_agent_loop import ScriptedEngine

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
TOOL_CALLS = [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6 * 7"}}}]


def test_turns_become_assistant_messages_with_tool_calls_and_tool_messages():
    called = assistant_message(f"Let me compute. {CALL}")
    assert called == {"role": "assistant", "content": "Let me compute.", "tool_calls": TOOL_CALLS}
    assert observation_messages("<tool_response>\n42\n</tool_response>", called) == [
        {"role": "tool", "name": "calculator", "content": "42"}
    ]
    plain = assistant_message("42")
    assert plain == {"role": "assistant", "content": "42"}
    assert observation_messages("higher", plain) == [{"role": "user", "content": "higher"}]
    malformed = assistant_message(f"{CALL} <tool_call>{{oops</tool_call>")  # kept as text, not half parsed
    assert malformed == {"role": "assistant", "content": f"{CALL} <tool_call>{{oops</tool_call>"}
    two = assistant_message(CALL + CALL)
    responses = "<tool_response>\n42\n</tool_response>\n<tool_response>\nerror: x\n</tool_response>"
    assert [m["content"] for m in observation_messages(responses, two)] == ["42", "error: x"]


@pytest.fixture(scope="module")
def tool_chat(tmp_path_factory):
    from agentrl.models.tiny import TinyShape, build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tool"
    texts = [CALL, "What is 6 * 7? 42 <tool_response>\n42\n</tool_response> Be brief.", "calculator expression"]
    build_tiny_model(path, texts, TinyShape(hidden_size=16, num_layers=1, num_heads=2, vocab_size=128))
    return ChatFormat(load_tokenizer(str(path)), system_prompt="Be brief.")


def test_a_qa_episode_with_a_tool_call_is_dumped_as_chat_messages(tool_chat):
    tokenizer = tool_chat.tokenizer
    turns = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tool_chat.eos_id] for text in (CALL, "42")]
    host = EnvHost("qa", {"reward_fn": "number_match", "tools": ["calculator"]})
    row = {"id": "r7", "prompt": "What is 6 * 7?", "answer": "42", "data_source": "sum"}
    episode = Episode(group=0, task_seed=1, task_id="r7", task_options=row, data_source="sum")
    sampling = SamplingParams(max_new_tokens=64, stop_token_ids=tool_chat.stop_ids)
    engine = ScriptedEngine(turns, tool_chat.eos_id)
    limits = EpisodeLimits(4, 64, 1000)
    asyncio.run(run_episode(engine, LocalEnvClient(host), tool_chat, EpisodeRules(sampling, limits), episode, key=0))
    record = json.loads(json.dumps(episode_record(episode, step=5)))
    call_id = record["messages"][2]["tool_calls"][0]["id"]  # the call and its result carry one id
    assert record["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, **TOOL_CALLS[0]}]},
        {"role": "tool", "tool_call_id": call_id, "name": "calculator", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    expected = {"task_id": "r7", "step": 5, "weight_version": 3, "reward": 1.0, "success": True}
    assert {key: record[key] for key in expected} == expected
    assert (record["finish"], record["turns"], record["data_source"], record["trained"]) == (
        "terminated",
        2,
        "sum",
        True,
    )
    assert [tool["function"]["name"] for tool in record["tools"]] == ["calculator"]


def test_a_redone_step_replaces_its_file_and_resume_drops_later_ones(tmp_path):
    for step in range(4):
        write_step(tmp_path, step, [{"step": step, "task_id": "a"}])
    write_step(tmp_path, 2, [{"step": 2, "task_id": "b"}, {"step": 2, "task_id": "c"}])
    assert [r["task_id"] for r in read_steps(tmp_path)[2]] == ["b", "c"]
    assert drop_dumps_from(tmp_path, 2) == 2
    assert sorted(read_steps(tmp_path)) == [0, 1]
    assert (tmp_path / "episodes" / "step_000001.jsonl").read_text() == '{"step": 1, "task_id": "a"}\n'
