"""The built-in qa env: a row's prompt is the first message, its answer graded by the named reward function
(by data_source when mapped), tools attached by name, rows checked."""

import pytest

from envs.qa import QAEnv

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


def test_answers_are_graded_by_the_reward_function_of_their_data_source():
    env = QAEnv(reward_fn="number_match", reward_fns={"words": "exact_match", "long": "contains"})
    assert env.reset(seed=0, options={"prompt": "6 * 7?", "answer": "42"}) == ("6 * 7?", {"answer": "42"})
    assert env.step("it is 42")[1:4] == (1.0, True, False)
    env.reset(seed=0, options={"prompt": "Capital?", "answer": "Paris", "data_source": "words"})
    assert env.step("it is Paris")[1] == 0.0  # exact_match: the whole answer must match
    env.reset(seed=0, options={"prompt": "Capital?", "answer": "Paris", "data_source": "words"})
    assert env.step("the Paris")[1] == 1.0
    env.reset(seed=0, options={"prompt": "Capital?", "answer": "Paris", "data_source": "long"})
    assert env.step("I think it is Paris.")[4] == {"success": True}
    env.reset(seed=0, options={"prompt": "n?", "answer": 42, "data_source": "elsewhere"})  # unmapped: reward_fn
    assert env.step("42")[1] == 1.0


def test_a_module_function_reward_and_unknown_names():
    from tests.unit.reward_fns import everything

    env = QAEnv(reward_fn="tests.unit.reward_fns:everything")
    env.reset(seed=0, options={"prompt": "q", "answer": "a", "data_source": "s"})
    assert env.step("abc")[1:3] == (0.5, True)
    assert everything.seen["answer"] == "a" and everything.seen["transcript"] == [("abc", "")]
    assert everything.seen["reset_info"]["data_source"] == "s" and everything.seen["task"] == "q"
    with pytest.raises(ValueError, match="names no reward function; use one of exact_match"):
        QAEnv(reward_fn="fuzzy")


def test_tools_attach_by_name_and_run():
    env = QAEnv(reward_fn="number_match", tools=["calculator"])
    assert [t["function"]["name"] for t in env.tools] == ["calculator"]
    env.reset(seed=1, options={"prompt": "What is 6 * 7?", "answer": "42"})
    observation, reward, terminated, _, info = env.step(CALL)
    assert (observation, reward, terminated, info["tool_calls"]) == (
        "<tool_response>\n42\n</tool_response>",
        0.0,
        False,
        1,
    )
    assert env.step("42")[1] == 1.0
    search = QAEnv(tools=["search"], tool_options={"search": {"num_documents": 30}})
    assert "[1]" in search.search("river")
    with pytest.raises(ValueError, match="unknown tool 'web'"):
        QAEnv(tools=["web"])
    with pytest.raises(ValueError, match="does not fit the calculator tool"):
        QAEnv(tools=["calculator"], tool_options={"calculator": {"precision": 3}})


def test_a_chat_prompt_puts_its_earlier_messages_before_the_question():
    prompt = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2 + 2?"},
    ]
    observation, info = QAEnv().reset(seed=0, options={"prompt": prompt, "answer": "4"})
    assert observation == "2 + 2?" and info["prompt_messages"] == prompt[:3]


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"answer": "1"}, "prompt is missing"),
        ({"prompt": 3, "answer": "1"}, "must be a string or a list of chat messages"),
        ({"prompt": [{"role": "assistant", "content": "x"}], "answer": "1"}, "must end with a user message"),
        (
            {
                "prompt": [
                    {"role": "user", "content": "a"},
                    {"role": "system", "content": "b"},
                    {"role": "user", "content": "c"},
                ],
                "answer": "1",
            },
            "system message after the first",
        ),
        ({"prompt": "q"}, "answer is missing"),
    ],
)
def test_rows_the_env_cannot_serve_are_named(row, problem):
    env = QAEnv()
    assert problem in env.check_row(row)
    with pytest.raises(ValueError, match="cannot serve this row"):
        env.reset(seed=0, options=row)


def test_without_a_row_it_asks_for_data_train():
    with pytest.raises(ValueError, match=r"set data\.train"):
        QAEnv().reset(seed=0)


def test_check_env_passes_with_rows_and_names_the_missing_data_without(capsys):
    from agentrl.cli import main
    from agentrl.env.check import check_env

    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]
    assert check_env("qa", {"tools": ["calculator"]}, rows=rows) == []
    assert main(["check-env", "qa", "--data", "launch/data/arith_val.jsonl"]) == 0
    assert main(["check-env", "qa"]) == 1
    assert "check-env qa --data FILE" in capsys.readouterr().out
