"""The search_qa env's demonstration generator: transcripts that open the passages a question needs and replay
through the real agent loop to reward 1 and the same tokens, guesses without the tools, and the seed split."""

import json
import string

import numpy as np
import pytest

from agentrl.sft.data import parse_line, read_transcripts, tokenize_all
from agentrl.sft.transcripts import TranscriptTokenizer
from envs.search_qa.demos import Demonstrator, demonstration, demonstrations, main
from envs.search_qa.env import SearchQAEnv
from tests.unit.test_sft_transcripts import rl_episode

KWARGS = {"split": "seeds", "max_steps": 4, "list_tools": False}  # as launch/configs/search_qa_rl.yaml


@pytest.fixture(scope="module")
def env():
    return SearchQAEnv(**KWARGS)


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl.models.tiny import build_tokenizer

    return build_tokenizer([string.printable, "open title tool_call tool_response"], vocab_size=200)


def test_one_and_two_hop_transcripts_earn_reward_1_through_the_agent_loop(env, tokenizer):
    hops = {}
    for seed in range(100):
        env.reset(seed=seed)
        hops.setdefault(env.question.hops, seed)
    assert set(hops) == {1, 2}
    for count, seed in hops.items():
        transcript, reward = demonstration(env, seed, "tool", np.random.default_rng(0))
        parse_line(json.dumps(transcript), f"{count} hops")
        assert reward == 1.0
        assistant = [m for m in transcript["messages"] if m["role"] == "assistant"]
        assert len(assistant) == count + 1  # one `open` a hop, then the answer
        episode, _ = rl_episode(tokenizer, "search_qa", KWARGS, seed, assistant)
        assert episode.finish == "terminated" and episode.success and episode.turns == count + 1
        out = TranscriptTokenizer(tokenizer)(transcript["messages"], transcript.get("tools"))
        assert (out.tokens, out.loss_mask) == (episode.tokens, episode.loss_mask)


def test_guesses_skip_the_tools_more_on_one_hop_questions_and_are_mostly_wrong(env):
    rows = list(demonstrations(range(300), Demonstrator(), KWARGS, seed=3))
    direct = [(len(t["messages"]), reward) for t, kind, reward in rows if kind == "direct"]
    assert all(length == 2 for length, _ in direct) and np.mean([reward for _, reward in direct]) < 0.3
    questions = {env.reset(seed=s)[0]: env.question.hops for s in range(300)}
    skipped = {1: [], 2: []}
    for transcript, kind, _ in rows:
        skipped[questions[transcript["messages"][0]["content"]]].append(kind == "direct")
    assert np.mean(skipped[1]) > 0.25 and np.mean(skipped[2]) < 0.2


def test_seeds_split_draws_test_questions_only_for_held_out_seeds(env):
    train = {env.reset(seed=s)[0] for s in range(1000)}
    heldout = {env.reset(seed=1_000_000 + s)[0] for s in range(200)}
    assert not train & heldout and heldout <= {q.text for q in env.test_questions}
    assert train <= {q.text for q in SearchQAEnv(split="train").questions}
    assert SearchQAEnv().tools and not env.tools
    with pytest.raises(ValueError, match="split must be one of"):
        SearchQAEnv(split="dev")


def test_the_script_writes_a_file_agentrl_sft_reads(tmp_path, monkeypatch, capsys, tokenizer):
    out = tmp_path / "demos.jsonl"
    monkeypatch.setattr("sys.argv", ["demos", str(out), "--seeds", "0:30", "--only-tool", "--no-tool-list"])
    main()
    assert "30 transcripts, 30 with the tool" in capsys.readouterr().out
    packed = tokenize_all(read_transcripts(out), TranscriptTokenizer(tokenizer), max_seq_len=1024)
    assert len(packed) == 30 and packed.truncated == 0
