"""`env.id: reasoning_gym:NAME`: reasoning-gym's own datasets and scorers through the adapter (the real package)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym", reason="pip install 'agentrl[reasoning-gym]' (in the dev extra)")

from agentrl.env import make
from agentrl.env.check import check_env
from tests.unit.ecosystem_runs import EVAL_AT_THE_END, assert_clean_steps, assert_evaluated, train, write_config

REPO = Path(__file__).resolve().parents[2]
SUMS = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [("basic_arithmetic", SUMS), ("countdown", {"min_numbers": 3, "max_numbers": 3}), ("letter_counting", {})],
)
def test_check_env_passes_on_the_packages_datasets(name, kwargs):
    assert check_env(f"reasoning_gym:{name}", kwargs) == []


def test_the_datasets_scorer_is_the_reward_and_a_full_score_is_success():
    env = make("reasoning_gym:basic_arithmetic", answer_tag=None, **SUMS)
    question, info = env.reset(seed=3)
    a, b = (int(part) for part in question.removeprefix("Calculate ").rstrip(".").split(" + "))
    assert info["answer"] == str(a + b)
    _, reward, terminated, truncated, step_info = env.step(f" {a + b} ")
    assert (reward, terminated, truncated, step_info["success"]) == (1.0, True, False, True)
    env.reset(seed=3)
    _, reward, terminated, _, step_info = env.step(str(a + b + 1))
    assert (reward, terminated, step_info["success"]) == (0.0, True, False)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("1")


def test_answers_are_read_from_the_answer_tag_and_countdown_scores_partial_credit():
    env = make("reasoning_gym:countdown", min_numbers=3, max_numbers=3)
    env.reset(seed=0)
    numbers = env.entry["metadata"]["numbers"]
    wrong_but_uses_the_numbers = " + ".join(str(n) for n in numbers)
    if env.entry["metadata"]["target"] == sum(numbers):
        pytest.skip("this seed's target is the plain sum")
    _, reward, _, _, info = env.step(f"I think <answer>{wrong_but_uses_the_numbers}</answer>")
    assert reward == pytest.approx(0.05) and info["success"] is False  # countdown's own partial score
    env.reset(seed=0)
    _, reward, _, _, info = env.step(env.entry["answer"])  # right, but outside the tag: no answer
    assert reward == pytest.approx(0.01) and info["success"] is False
    env.reset(seed=0)
    _, reward, _, _, info = env.step(f"<answer>{env.entry['answer']}</answer>")
    assert reward == 1.0 and info["success"] is True


def test_a_seed_picks_the_question_and_heldout_seeds_draw_only_heldout_questions():
    env = make("reasoning_gym:basic_arithmetic", heldout_every=5, **SUMS)
    assert env.reset(seed=11)[0] == make("reasoning_gym:basic_arithmetic", heldout_every=5, **SUMS).reset(seed=11)[0]
    train = {env.reset(seed=seed)[0] for seed in range(200)}
    heldout = {env.reset(seed=seed)[0] for seed in range(1_000_000, 1_000_200)}
    assert train and heldout and not train & heldout
    assert all(env.split.is_heldout(question) for question in heldout)
    assert len({env.reset(seed=seed)[0] for seed in range(40)}) > 10  # seeds spread over the dataset


def test_env_kwargs_are_the_datasets_config_and_bad_ones_are_named():
    env = make("reasoning_gym:basic_arithmetic", min_terms=3, max_terms=3, operators=["*"], min_digits=1, max_digits=1)
    question, _ = env.reset(seed=0)
    assert question.count("*") == 2
    with pytest.raises(ValueError, match=r"'max_term' .*did you mean 'max_terms'"):
        make("reasoning_gym:basic_arithmetic", max_term=3)
    with pytest.raises(ValueError, match=r"rejects env.kwargs .*max_terms must be >= min_terms"):
        make("reasoning_gym:basic_arithmetic", min_terms=4, max_terms=2)
    with pytest.raises(ValueError, match=r"no dataset 'countdwn'.*did you mean 'countdown'"):
        make("reasoning_gym:countdwn")
    with pytest.raises(ValueError, match="tries must be an int >= 1"):
        make("reasoning_gym:basic_arithmetic", tries=0)


def test_tries_give_another_answer_after_a_wrong_one():
    env = make("reasoning_gym:basic_arithmetic", answer_tag=None, tries=2, **SUMS)
    env.reset(seed=4)
    observation, reward, terminated, _, info = env.step("-1")
    assert not terminated and reward == 0.0 and "1 left" in observation and info["success"] is False
    _, reward, terminated, _, info = env.step(env.entry["answer"])
    assert terminated and reward == 1.0 and info["success"] is True


def test_without_the_package_the_error_names_the_extra():
    code = (
        "import sys; sys.modules['reasoning_gym'] = None\n"
        "from agentrl.env import make\n"
        "make('reasoning_gym:countdown')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 1
    assert "ImportError: env ids 'reasoning_gym:NAME' need the reasoning-gym package: pip install " in result.stderr
    assert "'agentrl[reasoning-gym]'" in result.stderr


@pytest.mark.timeout(600)  # a real run: the package's import and a model's build
def test_agentrl_train_runs_two_steps_on_a_dataset_and_evaluates_the_trained_model(tmp_path):
    """letter_counting in one process (basic_arithmetic trains on an env rank: tests/mpi/test_ecosystem_envs_mpi.py);
    the run's evaluation at its end asks 4 questions of the evaluation seeds."""
    kwargs = {"min_words": 1, "max_words": 2, "answer_tag": None}
    logged = train(write_config(tmp_path, "reasoning_gym:letter_counting", kwargs, **EVAL_AT_THE_END))
    assert_clean_steps(logged, steps=2, episodes=8)
    assert all(0.0 <= value <= 1.0 for _, value in logged["episode/reward_mean"])
    assert_evaluated(logged, step=2, episodes=4)


def sum_of(question: str) -> int:
    """The sum that "Calculate 5 + 9." asks for."""
    return sum(int(term) for term in question.removeprefix("Calculate ").rstrip(".").split(" + "))


def test_the_committed_demonstrations_keep_the_split_and_score_as_the_env_does():
    sys.path.insert(0, str(REPO / "launch" / "data"))
    try:
        from make_reasoning_gym_demos import ENV_ID, ENV_KWARGS
    finally:
        sys.path.remove(str(REPO / "launch" / "data"))
    env = make(ENV_ID, **ENV_KWARGS)
    for split, heldout in (("train", False), ("val", True)):
        lines = (REPO / "launch" / "data" / f"reasoning_gym_sft_{split}.jsonl").read_text().splitlines()
        rows = [json.loads(line)["messages"] for line in lines[:100]]
        assert all(env.split.is_heldout(question["content"]) == heldout for question, _ in rows)
        right = [question for question, answer in rows if int(answer["content"]) == sum_of(question["content"])]
        assert 0.4 < len(right) / len(rows) < 0.8  # the demonstrator is right about 60% of the time
