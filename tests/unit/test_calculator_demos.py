"""The calculator env's demonstration generator: valid SFT transcripts, tool calls that earn reward 1 when replayed
through the env and the real agent loop, imperfect answers without the tool, and a held-out split of problems."""

import json
import re
import string

import numpy as np
import pytest

from agentrl.sft.data import parse_line, read_transcripts, tokenize_all
from agentrl.sft.transcripts import TranscriptTokenizer
from envs.calculator import CalculatorEnv
from envs.calculator.demos import EASY_TEMPLATES, Demonstrator, demonstrations, main
from tests.unit.test_sft_transcripts import rl_episode

KWARGS = {"max_value": 99, "heldout_every": 10, "list_tools": False}  # as launch/configs/calculator_rl.yaml


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl.models.tiny import build_tokenizer

    return build_tokenizer([string.printable, "calculator tool_call tool_response expression"], vocab_size=200)


@pytest.fixture(scope="module")
def demos():
    return list(demonstrations(range(200), Demonstrator(), KWARGS, seed=3))


def test_tool_transcripts_pass_the_sft_checks_and_earn_reward_1_through_the_agent_loop(demos, tokenizer):
    tool = [(t, r) for t, kind, r in demos if kind == "tool"]
    assert len(tool) > 100
    for index, (transcript, reward) in enumerate(tool[:40]):
        parse_line(json.dumps(transcript), f"demo:{index}")  # roles, tool calls, JSON: the `agentrl sft` checks
        assert reward == 1.0
        question = transcript["messages"][0]["content"]
        seed = next(s for s in range(200) if CalculatorEnv(**KWARGS).reset(seed=s)[0] == question)
        assistant = [m for m in transcript["messages"] if m["role"] == "assistant"]
        call = assistant[0]["tool_calls"][0]["function"]["arguments"]["expression"]
        numbers = re.findall(r"\d+", question)
        assert re.findall(r"\d+", call)[: len(numbers)] == numbers  # the question's numbers, verbatim and in order
        episode, _ = rl_episode(tokenizer, "calculator", KWARGS, seed, assistant)
        assert episode.finish == "terminated" and episode.success and episode.reward == 1.0 and episode.turns == 2
        out = TranscriptTokenizer(tokenizer)(transcript["messages"], transcript.get("tools"))
        assert (out.tokens, out.loss_mask) == (episode.tokens, episode.loss_mask)


def test_direct_answers_skip_the_tool_more_on_easy_problems_and_are_sometimes_wrong(demos):
    env = CalculatorEnv(**KWARGS)
    rows = []
    for transcript, kind, reward in demos:
        question = transcript["messages"][0]["content"]
        template = next(env.reset(seed=s)[1]["template"] for s in range(200) if env.reset(seed=s)[0] == question)
        rows.append((template in EASY_TEMPLATES, kind, reward))
        if kind == "direct":
            assert len(transcript["messages"]) == 2 and "tool_calls" not in transcript["messages"][1]
    direct = [(easy, reward) for easy, kind, reward in rows if kind == "direct"]
    rewards = {reward for _, reward in direct}
    assert rewards == {0.0, 1.0}, "direct answers must be right sometimes and wrong sometimes"
    easy_rate = np.mean([kind == "direct" for easy, kind, _ in rows if easy])
    hard_rate = np.mean([kind == "direct" for easy, kind, _ in rows if not easy])
    assert easy_rate > 0.4 and hard_rate < 0.25


def test_held_out_seeds_draw_only_held_out_problems():
    env = CalculatorEnv(**KWARGS)
    train = {env.reset(seed=s)[0] for s in range(300)}
    heldout = {env.reset(seed=1_000_000 + s)[0] for s in range(100)}
    assert all(env.is_heldout(q) for q in heldout) and not any(env.is_heldout(q) for q in train)
    assert not train & heldout and len(heldout) > 90
    plain = CalculatorEnv(max_value=99)
    assert not plain.is_heldout(next(iter(heldout)))  # heldout_every=0 (the default): no split
    assert CalculatorEnv().tools and not env.tools and env.calculator("12 * 3") == "36"
    with pytest.raises(ValueError, match="heldout_every"):
        CalculatorEnv(heldout_every=1)


def test_the_script_writes_a_file_agentrl_sft_reads(tmp_path, monkeypatch, capsys, tokenizer):
    out = tmp_path / "demos.jsonl"
    monkeypatch.setattr("sys.argv", ["demos", str(out), "--seeds", "0:40", "--only-tool"])
    main()
    assert "40 transcripts, 40 with the tool" in capsys.readouterr().out
    transcripts = read_transcripts(out)
    packed = tokenize_all(transcripts, TranscriptTokenizer(tokenizer), max_seq_len=1024)
    assert len(packed) == 40 and packed.truncated == 0
