"""agentrl.rewards: the shared graders and the reward functions a config names."""

from decimal import Decimal

import pytest

from agentrl import rewards
from agentrl.rollout.reward_hook import RewardFunction


def test_graders():
    assert rewards.last_number("I think 1,234.5, no: -7 apples") == Decimal(-7)
    assert rewards.last_number("It costs 1,234.50") == Decimal("1234.50")
    assert rewards.last_number("none") is None
    assert rewards.normalize("  The  Tesk River!! ") == "tesk river"
    assert rewards.exact_match_score("the Tesk river.", ("Tesk", "Tesk River"))
    assert not rewards.exact_match_score("Tesk River delta", "Tesk River")
    assert rewards.token_f1_score("Tesk River delta", "Tesk River") == pytest.approx(0.8)
    assert rewards.token_f1_score("nothing shared", "Tesk") == 0.0
    assert rewards.number_match_score("so 41.9999999", "42")
    assert not rewards.number_match_score("so 41.9", 42)
    assert not rewards.number_match_score("42", None)


@pytest.mark.parametrize(
    ("name", "completion", "answer", "reward", "success"),
    [
        ("exact_match", "Paris.", "paris", 1.0, True),
        ("exact_match", "It is Paris", "paris", 0.0, False),
        ("token_f1", "It is Paris", "paris", 0.5, False),
        ("number_match", "the total is 1,200", "1200", 1.0, True),
        ("number_match", "the total is 12", "1200", 0.0, False),
        ("exact_match", "anything", None, 0.0, False),
        ("token_f1", "anything", None, 0.0, False),
    ],
)
def test_reward_functions_by_name(name, completion, answer, reward, success):
    score = RewardFunction(f"agentrl.rewards:{name}")(completion=completion, answer=answer)
    assert score.reward == pytest.approx(reward) and score.success is success


def test_number_match_on_calculator_agrees_with_the_env_reward():
    from envs.calculator import CalculatorEnv

    number_match = RewardFunction("agentrl.rewards:number_match")
    env = CalculatorEnv()
    for seed in range(20):
        _, info = env.reset(seed=seed)
        for text in (f"The answer is {info['answer']}", "The answer is 100000"):
            env.reset(seed=seed)
            _, env_reward, *_ = env.step(text)
            assert number_match(completion=text, answer=info["answer"]).reward == env_reward
