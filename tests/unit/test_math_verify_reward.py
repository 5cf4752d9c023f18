"""agentrl.rewards:math_verify: math answers graded by the math-verify package, where number_match's last number
is wrong (fractions, percents, a boxed answer followed by other numbers, equal expressions); threads and rows."""

import threading

import pytest

from agentrl import rewards
from agentrl.rollout.reward_hook import RewardFunction

pytest.importorskip("math_verify", reason="math-verify is in the dev extra (pip install -e '.[dev]')")


@pytest.mark.parametrize(
    ("completion", "answer", "success"),
    [
        ("so x = \\frac{1}{2}", "0.5", True),
        ("50%", "0.5", True),
        ("\\boxed{42} (checked in 3 steps)", "42", True),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
        ("\\boxed{(x+1)^2}", "x^2+2x+1", True),
        ("It costs $1,200.50", "1200.5", True),
        ("the total is 12", "1200", False),
        ("\\boxed{\\frac{1}{3}}", "0.5", False),
        ("no answer here", "7", False),
        ("42", None, False),
    ],
)
def test_math_verify_grades_what_number_match_reads_wrong(completion, answer, success):
    score = RewardFunction("agentrl.rewards:math_verify")(completion=completion, answer=answer)
    assert score.success is success and score.reward == float(success)


def test_several_accepted_answers_and_numbers_as_answers():
    assert rewards.math_verify_score("\\boxed{3}", ["2", "3"])
    assert rewards.math_verify_score("the answer is 7", 7)


def test_it_grades_off_the_main_thread_where_signal_timeouts_cannot_run():
    results = []
    worker = threading.Thread(target=lambda: results.append(rewards.math_verify("\\boxed{\\frac{3}{4}}", "0.75")))
    worker.start()
    worker.join(60)
    assert results == [{"reward": 1.0, "success": True}]


def test_the_qa_env_grades_rows_with_it_by_name():
    from envs.qa import QAEnv

    env = QAEnv(reward_fn="math_verify")
    env.reset(seed=0, options={"prompt": "Half of one?", "answer": "\\frac{1}{2}"})
    assert env.step("It is 0.5")[1:3] == (1.0, True)
