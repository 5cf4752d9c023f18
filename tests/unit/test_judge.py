"""reward.judge: an `agentrl serve` of a tiny model as the judge over real HTTP; batching, caching, timeouts, a
judge that is down and replies without a score, each failure reaching its episode with the reason."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.config import ConfigError, from_dict
from agentrl.config.schema import JudgeConfig, RewardConfig
from agentrl.scoring import ModelScorer, ScoreFailed
from agentrl.scoring.parse import judge_reward
from agentrl.scoring.transcript import fill
from tests.unit.judge_servers import MODEL, served_tiny_judge, slow_judge
from tests.unit.serve_server import ThreadServer, free_port

RUBRIC = "Rate the reply to the task from 0 to 10.\nTask: {task}\nReply: {completion}\nWrite Score: N."
# Constrained decoding (agentrl serve's response_format) makes even a random tiny judge write a parsable score.
SCORE_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "score",
        "schema": {
            "type": "object",
            "properties": {"score": {"enum": list(range(11))}},
            "required": ["score"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    with served_tiny_judge(tmp_path_factory.mktemp("judge")) as server:
        yield server


def scorer(base_url: str, **judge) -> ModelScorer:
    options = {"base_url": base_url + "/v1", "model": MODEL, "rubric": RUBRIC, "max_tokens": 8, **judge}
    return ModelScorer(RewardConfig(judge=JudgeConfig(**options)))


def episode(reply: str, task: str = "What is 2 + 3?") -> dict:
    return {"task": task, "completion": reply, "transcript": [(reply, "")], "answer": None}


async def score_all(judge: ModelScorer, episodes: list[dict]) -> list:
    return await asyncio.gather(*(judge.score(**e) for e in episodes), return_exceptions=True)


def test_one_completions_request_scores_a_whole_batch_and_unparsable_replies_fail(judge_server):
    judge = scorer(judge_server.base_url, api="completions", batch_size=4, batch_wait_s=5)
    judge_server.records.clear()
    started = time.perf_counter()
    results = asyncio.run(score_all(judge, [episode(f"It is {n}.") for n in range(4)]))
    assert time.perf_counter() - started < 5  # sent when the batch filled, not after batch_wait_s
    assert len(judge_server.records) == 4
    assert len({record.request_id for record in judge_server.records}) == 1  # one request, four prompts
    assert judge.batcher.counts.batches == 1
    # A random tiny model writes no "Score: N": each episode fails, with the reason and the reply, never a 0.
    assert all(isinstance(result, ScoreFailed) for result in results)
    assert all("no score in the judge's reply" in str(result) and "\nReply: " in str(result) for result in results)
    assert judge.batcher.counts.failed == 4 and not judge.batcher.cache  # failures are not cached


def test_a_judge_held_to_a_score_schema_scores_each_transcript_once(judge_server):
    judge = scorer(
        judge_server.base_url,
        api="chat",
        score_format="json",
        max_tokens=16,
        request_extra={"response_format": SCORE_SCHEMA},
        batch_wait_s=0.05,
    )
    judge_server.records.clear()
    replies = [episode("It is 5."), episode("It is 5."), episode("No idea."), episode("It is 5.")]
    first = asyncio.run(score_all(judge, replies))
    assert all(not isinstance(score, BaseException) for score in first), first
    assert all(0.0 <= score.reward <= 1.0 and score.reward * 10 == round(score.reward * 10) for score in first)
    assert len(judge_server.records) == 2  # two distinct transcripts, two calls: the repeats waited for theirs
    assert first[0].reward == first[1].reward == first[3].reward
    assert [score.metrics["score_cached"] for score in first] == [0.0, 1.0, 0.0, 1.0]
    again = asyncio.run(score_all(judge, [episode("No idea."), episode("It is 5.")]))
    assert len(judge_server.records) == 2  # both answered from the cache
    assert [score.reward for score in again] == [first[2].reward, first[0].reward]
    assert all(score.metrics["score_cached"] == 1.0 for score in again)


def test_a_judge_that_is_down_fails_its_episodes_with_the_reason():
    judge = scorer(f"http://127.0.0.1:{free_port()}", retries=1, timeout_s=5)
    results = asyncio.run(score_all(judge, [episode("It is 5."), episode("It is 6.")]))
    assert all(isinstance(result, ScoreFailed) for result in results)
    assert "cannot reach the judge at http://127.0.0.1:" in str(results[0]) and "each of 2 tries" in str(results[0])


def test_a_slow_judge_times_out_and_is_tried_again():
    app = slow_judge(delay_s=3)
    with ThreadServer(app) as server:
        judge = scorer(server.base_url, api="completions", timeout_s=0.3, retries=1, batch_wait_s=0)
        started = time.perf_counter()
        results = asyncio.run(score_all(judge, [episode("It is 5.")]))
        waited = time.perf_counter() - started
    assert isinstance(results[0], ScoreFailed)
    assert "did not answer within reward.judge.timeout_s=0.3 s (each of 2 tries)" in str(results[0])
    assert 0.6 <= waited < 2.5, waited
    assert app.state.calls == 2


def test_a_slow_judge_within_its_timeout_scores():
    with ThreadServer(slow_judge(delay_s=0.2)) as server:
        judge = scorer(server.base_url, api="chat", timeout_s=5)
        (score,) = asyncio.run(score_all(judge, [episode("It is 5.")]))
    assert score.reward == 0.5 and score.success is None


def test_the_api_key_comes_from_the_variable_named_and_an_unset_one_is_refused(monkeypatch):
    from agentrl.errors import UserError

    monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    with pytest.raises(UserError, match="api_key_env=JUDGE_TEST_KEY names an environment variable that is not set"):
        scorer("http://127.0.0.1:1", api_key_env="JUDGE_TEST_KEY")
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-test")
    app = slow_judge(delay_s=0)
    with ThreadServer(app) as server:
        (score,) = asyncio.run(score_all(scorer(server.base_url, api_key_env="JUDGE_TEST_KEY"), [episode("5")]))
    assert score.reward == 0.5 and app.state.authorization == "Bearer sk-test"


def test_scores_are_read_from_the_reply_as_the_rubric_asks():
    pattern = JudgeConfig.model_fields["score_pattern"].default
    assert judge_reward("Reasoning: 3 of 4 steps.\nScore: 7", "regex", pattern, (0, 10)) == 0.7
    assert judge_reward("score = 2.5 ... SCORE: 10", "regex", pattern, (0, 10)) == 1.0  # the last one counts
    assert judge_reward('{"score": 3}', "json", pattern, (1, 5)) == 0.5
    for reply, form, bounds, reason in [
        ("I would say seven.", "regex", (0, 10), "no score in the judge's reply"),
        ("Score: 11", "regex", (0, 10), "outside reward.judge.score_range [0, 10]"),
        ('{"score": "high"}', "json", (0, 10), 'JSON object with a numeric "score"'),
        ("score: 3", "json", (0, 10), 'JSON object with a numeric "score"'),
    ]:
        with pytest.raises(ScoreFailed, match=reason.replace("[", r"\[").replace("]", r"\]")):
            judge_reward(reply, form, pattern, bounds)


def test_the_rubric_gets_the_episode_and_keeps_other_braces():
    text = fill(
        'Task {task}; turns:\n{transcript}\nanswer {answer}; reply {completion}; write {"score": N}',
        {"task": "T", "completion": "c2", "transcript": [("c1", "higher"), ("c2", "correct")], "answer": None},
    )
    assert text == (
        "Task T; turns:\n[turn 1: model]\nc1\n[turn 1: environment]\nhigher\n[turn 2: model]\nc2\n"
        '[turn 2: environment]\ncorrect\nanswer (none); reply c2; write {"score": N}'
    )


GOOD_JUDGE = {"base_url": "http://h/v1", "model": "m", "rubric": "{completion}"}


@pytest.mark.parametrize(
    "judge, fix",
    [
        ({"rubric": "Rate {reply}"}, "reward.judge.rubric: names {reply}, which agentrl does not fill"),
        ({"rubric": "Rate it"}, "reward.judge.rubric: shows the scorer nothing the policy wrote; put {completion}"),
        ({"base_url": "h:8000"}, "reward.judge.base_url: must start with http:// or https://"),
        ({"score_range": [5, 5]}, "reward.judge.score_range: must be two finite numbers [low, high] with low < high"),
        ({"score_pattern": "score"}, "reward.judge.score_pattern: needs a group around the number"),
        ({"timeout_s": 0}, "reward.judge.timeout_s: Input should be greater than 0"),
    ],
)
def test_bad_judge_fields_name_the_field_and_the_fix(judge, fix):
    with pytest.raises(ConfigError) as error:
        from_dict({"model": {"path": "m"}, "reward": {"judge": {**GOOD_JUDGE, **judge}}})
    assert fix in str(error.value)


def test_two_scorers_at_once_are_refused():
    with pytest.raises(ConfigError, match=r"reward.judge and reward.model both score the episode; set one of them"):
        from_dict({"model": {"path": "m"}, "reward": {"judge": GOOD_JUDGE, "model": {"path": "rm"}}})
    both = {"model": {"path": "m"}, "env": {"reward_fn": "agentrl.rewards:contains"}, "reward": {"judge": GOOD_JUDGE}}
    with pytest.raises(ConfigError, match=r"env.reward_fn=agentrl.rewards:contains and reward.judge both score"):
        from_dict(both)


def test_a_judged_episode_takes_the_score_and_one_the_judge_cannot_score_fails_with_the_reason(tmp_path):
    from agentrl.rollout.failures import FailureTally
    from tests.unit.test_reward_hook import calculator_episode
    from tests.unit.test_tool_episodes import call

    chat = _calculator_chat()
    right = [lambda info: call("1 + 1"), lambda info: f"It is {info['answer']}"]
    app = slow_judge(delay_s=0)
    with ThreadServer(app) as server:
        replaced, _ = calculator_episode(chat, right, scorer(server.base_url, rubric="{transcript}"))
        added = ModelScorer(RewardConfig(judge=scorer(server.base_url).config.judge, mode="add", success_at=0.6))
        summed, _ = calculator_episode(chat, right, added)
    assert replaced.finish == "terminated" and replaced.reward == 0.5 and replaced.success  # the env's success
    assert replaced.metrics["score_cached"] == 0.0 and replaced.metrics["score_wait_s"] > 0
    assert summed.reward == 1.5 and not summed.success  # the env's 1.0 + the judge's 0.5, under success_at
    down, _ = calculator_episode(chat, right, scorer(f"http://127.0.0.1:{free_port()}"))
    assert down.finish == "error" and down.reward == 0.0 and sum(down.loss_mask) == 0
    assert down.error.startswith(f"reward.judge ({MODEL} at http://127.0.0.1:")
    assert "cannot reach the judge" in down.error
    (kind,) = FailureTally.of([down, replaced]).kinds
    assert "cannot reach the judge" in kind


def _calculator_chat():
    import string

    from agentrl.models.chat_format import ChatFormat
    from agentrl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer([string.printable, "calculator tool_call tool_response expression"], vocab_size=200)
    return ChatFormat(tokenizer)
