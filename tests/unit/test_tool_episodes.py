"""Tools in the first prompt (rendered by the template or as text) and whole tool-calling episodes, token-exact."""

import asyncio
import string

import pytest

from agentrl.engine.base import SamplingParams
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.models.chat_format import ChatFormat
from agentrl.models.tiny import CHAT_TEMPLATE, build_tokenizer
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.trajectory import Episode
from envs.calculator import CalculatorEnv, evaluate
from tests.unit.test_agent_loop import ScriptedEngine

TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}" + CHAT_TEMPLATE
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer([string.printable, "calculator tool_call tool_response expression"], vocab_size=200)


def call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def test_template_without_tools_gets_a_text_tool_list(tokenizer):
    chat = ChatFormat(tokenizer, system_prompt="Be brief.")
    assert not chat.template_renders_tools
    text = tokenizer.decode(chat.prompt_ids("2 + 2?", CalculatorEnv().tools))
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools:\n- calculator: Evaluate")
    assert '"required":["expression"]' in text and text.endswith("2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    assert chat.prompt_ids("2 + 2?", []) == chat.prompt_ids("2 + 2?")


def test_template_that_renders_tools_gets_them():
    tokenizer = build_tokenizer([string.printable], vocab_size=120)
    tokenizer.chat_template = TOOLS_TEMPLATE
    chat = ChatFormat(tokenizer)
    assert chat.template_renders_tools
    text = tokenizer.decode(chat.prompt_ids("2 + 2?", CalculatorEnv().tools))
    assert text.startswith("<|im_start|>system\nTools: calculator<|im_end|>") and "You can call" not in text


def test_calculator_is_safe_and_exact():
    assert evaluate("(12 + 3) * 4 / 2 - -1") == 31
    for bad in ["__import__('os')", "2 ** 10", "x + 1", "1 / 0", "[1, 2]", "9" * 201]:
        with pytest.raises(ValueError):
            evaluate(bad)


def test_tool_episode_keeps_engine_tokens_and_shows_errors(tokenizer):
    chat = ChatFormat(tokenizer)
    host = EnvHost("calculator", {})
    _, info, tools = host.handle("reset", "peek", 7, None).value
    assert [t["function"]["name"] for t in tools] == ["calculator"]
    turns = [call("1 / 0"), call("6 * 7") + call("2 +"), f"The answer is {info['answer']}"]
    token_turns = [[*tokenizer(t, add_special_tokens=False)["input_ids"], chat.eos_id] for t in turns]
    sampling = SamplingParams(max_new_tokens=400, stop_token_ids=chat.stop_ids)
    episode = Episode(group=0, task_seed=7)
    engine = ScriptedEngine([list(t) for t in token_turns], chat.eos_id)
    asyncio.run(
        run_episode(engine, LocalEnvClient(host), chat, EpisodeRules(sampling, EpisodeLimits(4, 400, 2000)), episode, 0)
    )

    assert episode.finish == "terminated" and episode.success and episode.reward == 1.0 and episode.turns == 3
    assert "error: tool 'calculator' raised ValueError: division by zero" in episode.text
    assert "<tool_response>\n42\n</tool_response>" in episode.text and "not an arithmetic expression" in episode.text
    assert episode.tokens[: episode.prompt_len] == chat.prompt_ids(episode.text.split("\n>>> ")[0], tools)
    position = episode.prompt_len
    for index, ids in enumerate(token_turns):  # generated tokens verbatim at mask 1, observations at mask 0
        assert episode.tokens[position : position + len(ids)] == ids
        assert episode.loss_mask[position : position + len(ids)] == [1] * len(ids)
        position += len(ids)
        if index < len(token_turns) - 1:
            observation = episode.text.split("\n>>> ")[index + 1].split("\n", 1)[1]
            observation_ids = chat.observation_ids(observation)
            assert episode.tokens[position : position + len(observation_ids)] == observation_ids
            position += len(observation_ids)
    assert position == len(episode.tokens) and sum(episode.loss_mask) == sum(map(len, token_turns))
