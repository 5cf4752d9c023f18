"""search_qa: BM25 scoring, the generated world and questions, grading, tools and the episode protocol."""

import asyncio
import json
import math
import re
import string

import pytest

from agentrl.engine.base import SamplingParams
from agentrl.env.check import check_env
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.models.chat_format import ChatFormat
from agentrl.models.tiny import build_tokenizer
from agentrl.rewards import exact_match_score as exact_match
from agentrl.rewards import normalize
from agentrl.rewards import token_f1_score as token_f1
from agentrl.rollout.agent_loop import EpisodeLimits, EpisodeRules, run_episode
from agentrl.trajectory import Episode
from envs.search_qa import BM25Index, SearchQAEnv, load_library, tokenize
from envs.search_qa.corpus import render_corpus
from envs.search_qa.questions import expand_kinds, make_questions
from envs.search_qa.world import make_world
from tests.unit.test_agent_loop import ScriptedEngine


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_tokenize_lowercases_and_drops_punctuation_and_stopwords():
    assert tokenize("Who founded the Tesk-River Works, in 1801?") == ["founded", "tesk", "river", "works", "1801"]


def test_bm25_scores_match_a_hand_computation():
    index = BM25Index(["apple banana", "apple apple cherry", "banana cherry cherry date"], k1=1.2, b=0.75)
    # N = 3, "apple" in 2 documents; lengths 2, 3, 4 so avgdl = 3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    doc0 = idf * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 2 / 3))
    doc1 = idf * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 3 / 3))
    assert index.scores("apple").tolist() == pytest.approx([doc0, doc1, 0.0])
    # distinct query terms add up; a repeated query word counts once
    date_idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    doc2 = date_idf * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 4 / 3))
    assert index.scores("apple date date").tolist() == pytest.approx([doc0, doc1, doc2])


def test_bm25_ranks_the_document_with_a_rare_term_first():
    documents = [f"the river town market bridge number {i}" for i in range(30)]
    documents[17] += " zebra"
    index = BM25Index(documents)
    hits = index.search("river market zebra", k=3)
    assert hits[0][0] == 17
    assert hits[0][1] > hits[1][1]


def test_bm25_search_leaves_out_non_matching_documents_and_breaks_ties_by_position():
    index = BM25Index(["red fox", "blue fox", "green owl"])
    assert [doc_id for doc_id, _ in index.search("fox", k=5)] == [0, 1]
    assert index.search("walrus", k=5) == []


def test_bm25_rejects_bad_parameters():
    with pytest.raises(ValueError, match="b must be in"):
        BM25Index(["a doc"], b=1.5)
    with pytest.raises(ValueError, match="at least one document"):
        BM25Index([])


def test_world_corpus_and_questions_are_reproducible_from_the_seed():
    first, again, other = make_world(3, 120), make_world(3, 120), make_world(4, 120)
    assert render_corpus(first, 3) == render_corpus(again, 3)
    assert make_questions(first) == make_questions(again)
    assert render_corpus(first, 3) != render_corpus(other, 4)
    assert len(render_corpus(first, 3)) == 120


def test_titles_are_unique_and_every_question_answer_is_in_its_last_gold_passage():
    library = load_library(0, 300, 1.2, 0.75)
    titles = [document.title for document in library.documents]
    assert len(titles) == len(set(titles)) == 300
    for question in library.questions:
        passage = library.find(question.gold_titles[-1])
        assert passage is not None, question
        assert re.search(rf"\b{re.escape(question.answer)}\b", passage.text), question


def test_every_gold_passage_is_in_the_top5_for_its_entity_name():
    library = load_library(0, 300, 1.2, 0.75)
    for question in library.questions:
        for title in question.gold_titles:
            found = [document.title for document, _ in library.search(title, 5)]
            assert title in found, (question.text, title, found)


def test_reset_is_reproducible_and_reports_the_answer():
    env = SearchQAEnv(num_documents=120)
    first = env.reset(seed=11)
    assert SearchQAEnv(num_documents=120).reset(seed=11) == first
    question, info = first
    assert question.endswith("?") and info["answer"]
    assert len({SearchQAEnv(num_documents=120).reset(seed=seed)[0] for seed in range(20)}) > 10


def test_train_and_test_splits_are_disjoint_and_cover_all_questions():
    train, test, every = (SearchQAEnv(split=split).questions for split in ("train", "test", "all"))
    assert not set(train) & set(test)
    assert len(train) + len(test) == len(every)
    assert len(test) < len(train)


def test_question_types_select_kinds_and_unknown_types_fail_clearly():
    env = SearchQAEnv(question_types=["two_hop"], split="all")
    assert {question.hops for question in env.questions} == {2}
    assert {question.kind for question in SearchQAEnv(question_types=["river_length"]).questions} == {"river_length"}
    assert "birth_year" in expand_kinds(["one_hop"])
    with pytest.raises(ValueError, match=r"unknown question type 'colour'.*one_hop"):
        SearchQAEnv(question_types=["colour"])
    with pytest.raises(ValueError, match=r"must be a list of names, for example \['two_hop'\]"):
        SearchQAEnv(question_types="two_hop")


def test_grading_normalises_case_punctuation_and_articles():
    assert normalize("  The  Tesk River!! ") == "tesk river"
    assert exact_match("the tesk river.", ("Tesk River",))
    assert not exact_match("Tesk", ("Tesk River",))
    assert token_f1("Tesk", ("Tesk River",)) == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert token_f1("Gerk", ("Tesk River",)) == 0.0


def test_correct_answer_gets_1_and_wrong_answer_gets_0():
    env = SearchQAEnv()
    _, info = env.reset(seed=5)
    _, reward, terminated, truncated, step_info = env.step(f"The {info['answer']}.")
    assert (reward, terminated, truncated, step_info["success"]) == (1.0, True, False, True)
    env.reset(seed=5)
    _, reward, terminated, _, step_info = env.step("Nowhere at all")
    assert (reward, terminated, step_info["success"]) == (0.0, True, False)


def test_river_answers_accept_the_short_name_and_partial_credit_is_opt_in():
    env = SearchQAEnv(question_types=["town_river"], split="all", partial_credit=True)
    _, info = env.reset(seed=0)
    short = info["answer"].removesuffix(" River")
    assert env.step(short)[1] == 1.0
    env.reset(seed=0)
    _, reward, _, _, step_info = env.step(f"{short} Creek")
    assert 0.0 < reward < 1.0 and not step_info["success"]


def test_search_finds_the_gold_passage_and_open_reads_it():
    env = SearchQAEnv()
    env.reset(seed=2)
    gold = env.question.gold_titles[0]
    obs, reward, terminated, _, info = env.step(call("search", query=gold, k=2))
    assert f"] {gold}\n" in obs and obs.count("<tool_response>") == 1
    assert (reward, terminated, info["tool_errors"]) == (0.0, False, 0)
    obs, *_ = env.step(call("open", title=gold.upper()))
    assert env.library.find(gold).text in obs


def test_tool_errors_come_back_as_messages():
    env = SearchQAEnv(max_steps=10)
    env.reset(seed=0)
    cases = [
        (call("search", query="river", k="three"), "must be a JSON integer"),
        (call("search", query=42), "must be a JSON string"),
        (call("search", query="river", k=50), "k must be between 1 and 10"),
        (call("open", title="Atlantis"), "no passage is titled 'Atlantis'"),
        (call("browse", url="x"), "unknown tool 'browse'"),
    ]
    for action, message in cases:
        obs, reward, terminated, _, info = env.step(action)
        assert message in obs and info["tool_errors"] == 1 and not terminated and reward == 0.0


def test_step_outside_an_episode_raises():
    env = SearchQAEnv()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("x")
    env.reset(seed=0)
    env.step("a guess")
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("another guess")


def test_episode_is_truncated_after_max_steps_of_tool_calls():
    env = SearchQAEnv(max_steps=2)
    env.reset(seed=0)
    assert env.step(call("search", query="river"))[3] is False
    _, _, terminated, truncated, info = env.step(call("search", query="river"))
    assert (terminated, truncated, info["success"]) == (False, True, False)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(call("search", query="river"))


def test_check_env_reports_no_problems():
    assert check_env("search_qa", {}) == []


def test_two_hop_episode_through_the_agent_loop_searches_twice_and_is_graded():
    host = EnvHost("search_qa", {"question_types": ["founder_birth_year"]})
    question, info, _ = host.handle("reset", "peek", 4, None).value
    company, founder = next(
        q.gold_titles for q in SearchQAEnv(question_types=["founder_birth_year"]).questions if q.text == question
    )
    tokenizer = build_tokenizer([string.printable], vocab_size=120)
    chat = ChatFormat(tokenizer)
    turns = [call("search", query=company), call("search", query=founder, k=1), info["answer"]]
    token_turns = [[*tokenizer(turn, add_special_tokens=False)["input_ids"], chat.eos_id] for turn in turns]
    engine = ScriptedEngine(token_turns, chat.eos_id)
    episode = Episode(group=0, task_seed=4)
    sampling = SamplingParams(max_new_tokens=200, stop_token_ids=chat.stop_ids)
    asyncio.run(
        run_episode(engine, LocalEnvClient(host), chat, EpisodeRules(sampling, EpisodeLimits(4, 200, 4000)), episode, 0)
    )
    assert (episode.finish, episode.success, episode.reward, episode.turns) == ("terminated", True, 1.0, 3)
    second_response = episode.text.split("<tool_response>")[2]
    assert second_response.startswith(f"\n[1] {founder}\n") and info["answer"] in second_response
