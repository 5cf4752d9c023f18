"""reward.model: a tiny random sequence-classification model scores episodes in batches, the same as one by one,
each text once; a text too long fails alone, with the fix."""

from __future__ import annotations

import asyncio
import math

import pytest

from agentrl.config.schema import RewardConfig, RewardModelConfig
from agentrl.errors import UserError
from agentrl.scoring import ModelScorer, ScoreFailed
from agentrl.scoring.transcript import conversation
from tests.unit.serve_server import build_serve_model


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    return build_reward_model(tmp_path_factory.mktemp("reward_model"))


def build_reward_model(folder):
    """The serve tests' tiny Qwen2 with a random one-label score head in place of its LM head, in folder/rm."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    causal = build_serve_model(folder / "causal")
    model = AutoModelForSequenceClassification.from_pretrained(causal, num_labels=1)
    model.save_pretrained(folder / "rm")
    AutoTokenizer.from_pretrained(causal).save_pretrained(folder / "rm")
    return folder / "rm"


def scorer(path, **options) -> ModelScorer:
    success_at = options.pop("success_at", None)
    return ModelScorer(RewardConfig(model=RewardModelConfig(path=str(path), **options), success_at=success_at))


def episode(reply: str, task: str = "What is 2 + 3?", observation: str = "") -> dict:
    return {"task": task, "completion": reply, "transcript": [(reply, observation)], "answer": "5"}


async def score_all(rm: ModelScorer, episodes: list[dict]) -> list:
    return await asyncio.gather(*(rm.score(**e) for e in episodes), return_exceptions=True)


REPLIES = ["It is 5.", "It is 6.", "No idea.", "5"]


def test_a_batch_scores_as_each_episode_alone_and_each_text_once(reward_model_dir):
    batched = scorer(reward_model_dir, batch_size=8, batch_wait_s=0.2)
    together = asyncio.run(score_all(batched, [episode(reply) for reply in [*REPLIES, REPLIES[0]]]))
    assert batched.batcher.counts.batches == 1  # one forward for the four distinct texts
    alone = scorer(reward_model_dir, batch_size=1)
    single = [asyncio.run(score_all(alone, [episode(reply)]))[0] for reply in REPLIES]
    assert alone.batcher.counts.batches == 4
    for mixed, own in zip(together, single, strict=False):
        assert math.isclose(mixed.reward, own.reward, rel_tol=1e-4, abs_tol=1e-5)
    assert len({round(score.reward, 6) for score in single}) == 4  # the random head tells the texts apart
    assert together[4].reward == together[0].reward and together[4].metrics["score_cached"] == 1.0
    again = asyncio.run(score_all(batched, [episode(REPLIES[2])]))
    assert again[0].reward == together[2].reward and batched.batcher.counts.batches == 1  # from the cache


def test_the_conversation_goes_through_the_chat_template_unless_a_prompt_is_given(reward_model_dir):
    chat = scorer(reward_model_dir)
    arguments = {"task": "Guess", "completion": "7", "transcript": [("5", "higher"), ("7", "correct")]}
    expected = chat.reward_model.tokenizer.apply_chat_template(conversation(arguments), tokenize=False)
    assert chat.text(arguments) == expected
    assert "higher" in expected and "correct" not in expected  # the env's answer after the judged reply is left out
    plain = scorer(reward_model_dir, prompt="Q: {task}\nA: {completion}")
    assert plain.text(arguments) == "Q: Guess\nA: 7"


def test_sigmoid_squashes_the_logit_and_success_at_sets_success(reward_model_dir):
    raw = asyncio.run(score_all(scorer(reward_model_dir), [episode("It is 5.")]))[0].reward
    sigmoid = scorer(reward_model_dir, transform="sigmoid", success_at=0.0)
    squashed = asyncio.run(score_all(sigmoid, [episode("It is 5.")]))
    assert math.isclose(squashed[0].reward, 1 / (1 + math.exp(-raw)), rel_tol=1e-6)
    assert squashed[0].success is True


def test_a_text_over_max_length_fails_alone_with_the_fix(reward_model_dir):
    rm = scorer(reward_model_dir, max_length=48, batch_wait_s=0.2)
    short, long = asyncio.run(score_all(rm, [episode("5"), episode("It is five. " * 40)]))
    assert isinstance(short.reward, float)
    assert isinstance(long, ScoreFailed) and "over reward.model.max_length=48; raise max_length" in str(long)


def test_a_label_the_model_lacks_is_refused_with_the_fix(reward_model_dir):
    with pytest.raises(UserError, match=r"label=3, but .* has 1 label\(s\); set reward.model.label below 1"):
        scorer(reward_model_dir, label=3)
