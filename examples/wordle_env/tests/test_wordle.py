"""The example env's own tests: `cd examples/wordle_env && pytest` (agentrl installed)."""

import pytest
from agentrl.env.check import check_env

from agentrl_wordle import WordleEnv, find_guess, score, shipped_words

CONFIG_WORDS = ["cat", "cot", "cut", "hat", "hot", "hut"]


@pytest.mark.parametrize(
    ("guess", "secret", "marks"),
    [
        ("cat", "cat", "GGG"),
        ("act", "cat", "YYG"),
        ("dog", "cat", "..."),
        ("eel", "bee", "YG."),
        ("eee", "bee", ".GG"),
        ("bee", "eel", ".GY"),
    ],
)
def test_score_marks_greens_then_yellows_for_unmatched_letters(guess, secret, marks):
    assert score(guess, secret) == marks


def test_find_guess_takes_the_first_listed_word_in_any_case():
    assert find_guess("I think HOT, or cat", set(CONFIG_WORDS)) == "hot"
    assert find_guess("42 dogs", set(CONFIG_WORDS)) is None


def test_reading_the_marks_wins_every_config_game_in_three_guesses():
    for seed in range(20):
        env = WordleEnv(words=CONFIG_WORDS, max_guesses=3)
        env.reset(seed=seed)
        candidates = list(CONFIG_WORDS)
        for _ in range(3):
            guess = candidates[0]
            observation, reward, terminated, _, info = env.step(guess)
            marks = observation.split()[1].rstrip(",;")
            candidates = [word for word in candidates if score(guess, word) == marks]
            if terminated:
                break
        assert info["success"] and reward == 1.0 and observation.endswith("solved")


def test_wrong_guesses_use_up_the_game_and_then_step_raises():
    env = WordleEnv(words=CONFIG_WORDS, max_guesses=2, valid_reward=0.1)
    _, info = env.reset(seed=3)
    info_answer = info["answer"]
    wrong = next(word for word in CONFIG_WORDS if word != info_answer)
    assert env.step(wrong)[1:4] == (0.1, False, False)
    observation, reward, terminated, _, info = env.step("no word here")
    assert terminated and reward == 0.0 and not info["success"]
    assert observation.startswith("invalid guess") and observation.endswith(f"the word was {info_answer}")
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(wrong)


def test_tool_search_costs_no_guess_but_turns_run_out():
    env = WordleEnv(words=CONFIG_WORDS, max_guesses=1, max_turns=2)
    env.reset(seed=0)
    call = '<tool_call>{"name": "words_matching", "arguments": {"pattern": "h?t", "exclude": "u"}}</tool_call>'
    observation, _, terminated, truncated, info = env.step(call)
    assert "hat, hot" in observation and info["tool_errors"] == 0 and not (terminated or truncated)
    observation, _, _, truncated, info = env.step(call.replace("h?t", "h?"))
    assert "must have 3 characters" in observation and info["tool_errors"] == 1 and truncated


def test_seeded_resets_repeat_and_the_shipped_list_loads():
    assert WordleEnv().reset(seed=7) == WordleEnv().reset(seed=7)
    assert len(shipped_words()) >= 20 and WordleEnv().words == shipped_words()


def test_bad_word_lists_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="one length"):
        WordleEnv(words=["cat", "horse"])
    with pytest.raises(ValueError, match="distinct"):
        WordleEnv(words=["cat", "cat"])


def test_agentrl_check_env_finds_no_problem():
    assert check_env("agentrl_wordle:WordleEnv", {"words": CONFIG_WORDS, "max_guesses": 3}) == []
