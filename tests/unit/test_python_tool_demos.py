"""The python_tool env's demonstration generator: a program for every family that the sandbox runs to the right
answer, transcripts that replay through the real agent loop to reward 1 and the same tokens, imperfect answers
without the tool, and the held-out split."""

import json
import string

import numpy as np
import pytest

from agentrl.sft.data import parse_line, read_transcripts, tokenize_all
from agentrl.sft.transcripts import TranscriptTokenizer
from envs.python_tool import PythonToolEnv
from envs.python_tool.demos import EASY_FAMILIES, PROGRAMS, Demonstrator, demonstration, demonstrations, main
from envs.python_tool.problems import FAMILIES
from tests.unit.test_sft_transcripts import rl_episode

KWARGS = {"difficulty": 1, "heldout_every": 10, "list_tools": False}  # as launch/configs/python_tool_rl.yaml


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl.models.tiny import build_tokenizer

    return build_tokenizer([string.printable, "python tool_call tool_response code print"], vocab_size=200)


def first_seed_of_each_family(env: PythonToolEnv, seeds=range(300)) -> dict[str, int]:
    found: dict[str, int] = {}
    for seed in seeds:
        found.setdefault(env.reset(seed=seed)[1]["family"], seed)
    return found


def test_every_family_has_a_program_that_earns_reward_1_through_the_agent_loop(tokenizer):
    env = PythonToolEnv(**KWARGS)
    seeds = first_seed_of_each_family(env)
    assert set(seeds) == set(FAMILIES) == set(PROGRAMS)
    for family, seed in seeds.items():
        transcript, reward = demonstration(env, seed, "tool", np.random.default_rng(0))
        parse_line(json.dumps(transcript), family)  # roles, tool calls, JSON: the `agentrl sft` checks
        assert reward == 1.0, family
        assistant = [m for m in transcript["messages"] if m["role"] == "assistant"]
        episode, _ = rl_episode(tokenizer, "python_tool", KWARGS, seed, assistant)
        assert episode.finish == "terminated" and episode.success and episode.turns == 2, family
        out = TranscriptTokenizer(tokenizer)(transcript["messages"], transcript.get("tools"))
        assert (out.tokens, out.loss_mask) == (episode.tokens, episode.loss_mask), family


def test_direct_answers_skip_the_tool_more_on_easy_families_and_are_mostly_wrong():
    rows = [(t["messages"][0]["content"], kind, reward) for t, kind, reward in _direct_only_demos()]
    assert {reward for _, _, reward in rows} == {0.0, 1.0}, "direct answers must be right sometimes, wrong sometimes"
    assert np.mean([reward for _, _, reward in rows]) < 0.5
    env = PythonToolEnv(**KWARGS)
    family_of = {question: info["family"] for question, info in (env.reset(seed=s) for s in range(150))}
    skipped = {True: [], False: []}  # easy-looking family or not -> whether each demonstration skipped the tool
    for transcript, kind, _ in demonstrations(range(150), Demonstrator(), KWARGS, seed=3):  # a sandbox run each
        easy = family_of[transcript["messages"][0]["content"]] in EASY_FAMILIES
        skipped[easy].append(kind == "direct")
    assert np.mean(skipped[True]) > 0.4 and np.mean(skipped[False]) < 0.25


def test_a_demonstration_of_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be 'tool' or 'direct', got 'guess'"):
        demonstration(PythonToolEnv(**KWARGS), 0, "guess", np.random.default_rng(0))


def _direct_only_demos():
    always_direct = Demonstrator(direct_easy=1.0, direct_hard=1.0, direct_correct=0.3)
    return list(demonstrations(range(60), always_direct, KWARGS, seed=5))


def test_held_out_seeds_draw_only_held_out_problems():
    env = PythonToolEnv(**KWARGS)
    train = {env.reset(seed=s)[0] for s in range(300)}
    heldout = {env.reset(seed=1_000_000 + s)[0] for s in range(100)}
    assert all(env.split.is_heldout(q) for q in heldout) and not any(env.split.is_heldout(q) for q in train)
    assert not train & heldout and len(heldout) > 80  # a few families have few problems (fibonacci: 61 at difficulty 1)
    assert PythonToolEnv().tools and not env.tools
    with pytest.raises(ValueError, match="heldout_every"):
        PythonToolEnv(heldout_every=1)


def test_the_script_writes_a_file_agentrl_sft_reads(tmp_path, monkeypatch, capsys, tokenizer):
    out = tmp_path / "demos.jsonl"
    monkeypatch.setattr("sys.argv", ["demos", str(out), "--seeds", "0:20", "--only-tool", "--no-tool-list"])
    main()
    assert "20 transcripts, 20 with the tool" in capsys.readouterr().out
    transcripts = read_transcripts(out)
    packed = tokenize_all(transcripts, TranscriptTokenizer(tokenizer), max_seq_len=1024)
    assert len(packed) == 20 and packed.truncated == 0
