"""env ids skyrl_gym:NAME: SkyRL-Gym's own environments (gsm8k, gsm8k_multi_turn, text2sql over a SQLite file made
here) serve rows in SkyRL's format, pass check-env, train two steps of a tiny model, and fail bad episodes by name."""

import json
import sqlite3

import pytest

from agentrl.env import make
from agentrl.env.check import check_env
from agentrl.env.host import EnvHost
from tests.unit.ecosystem_runs import assert_clean_steps, assert_evaluated, train, write_config

pytest.importorskip("skyrl_gym", reason="skyrl-gym is in the dev extra (pip install -e '.[dev]')")


def gsm8k_rows(count=8):
    return [
        {
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"What is {i} + {i + 1}? End with '#### ANSWER'."}],
            "env_class": "gsm8k",
            "reward_spec": {"method": "rule", "ground_truth": str(2 * i + 1)},
            "extra_info": {"max_turns": 3},
        }
        for i in range(count)
    ]


def sql_rows(db_root, count=8):
    """Rows of SkyRL's text2sql env (data: spider) over one SQLite database written under `db_root`."""
    folder = db_root / "spider" / "database" / "shop"
    folder.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(folder / "shop.sqlite") as db:
        db.execute("CREATE TABLE IF NOT EXISTS fruit (name TEXT, price INTEGER)")
        db.execute("DELETE FROM fruit")
        db.executemany("INSERT INTO fruit VALUES (?, ?)", [("apple", 3), ("pear", 5), ("plum", 2), ("fig", 7)])
    rows = []
    for i in range(count):
        limit = 2 + i % 5
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": "Write SQL in <sql></sql>; answer in <solution></solution>."},
                    {"role": "user", "content": f"Which fruit cost less than {limit}? Table fruit(name, price)."},
                ],
                "env_class": "text2sql",
                "db_id": "shop",
                "data": "spider",
                "reward_spec": {"method": "rule", "ground_truth": f"SELECT name FROM fruit WHERE price < {limit}"},
                "max_turns": 3,
            }
        )
    return rows


def test_gsm8k_grades_the_answer_line_and_multi_turn_pays_per_turn():
    env = make("skyrl_gym:gsm8k")
    row = gsm8k_rows()[2]
    observation, info = env.reset(seed=0, options=row)
    assert observation == row["prompt"][0]["content"] and info["answer"] == "5"
    assert env.step("2 + 3 = 5\n#### 5")[1:5] == (1.0, True, False, {"skyrl_metadata": {}, "success": True})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("#### 5")
    multi = make("skyrl_gym:gsm8k_multi_turn")
    multi.reset(seed=0, options=row)
    text, reward, done, _, _ = multi.step("#### 4")  # formatted but wrong: SkyRL's format score, and a next turn
    assert (reward, done) == (pytest.approx(0.2 / 3), False) and "#### ANSWER" in text
    assert multi.step("#### 5")[1:3] == (1.0, True)


def test_text2sql_runs_queries_against_the_database_and_grades_the_solution(tmp_path):
    env = make("skyrl_gym:text2sql", env_config={"db_path": str(tmp_path)})
    observation, info = env.reset(seed=0, options=sql_rows(tmp_path)[1])
    assert "less than 3" in observation and info["prompt_messages"][0]["role"] == "system"
    text, reward, done, _, _ = env.step("<think>look</think><sql>SELECT name FROM fruit WHERE price < 3</sql>")
    assert "plum" in text and "apple" not in text and (reward, done) == (0.0, False)
    answer = "<think>done</think><solution>SELECT name FROM fruit WHERE price < 3</solution>"
    assert env.step(answer)[1:3] == (1.0, True)


def test_check_env_passes_on_three_skyrl_envs_and_names_missing_rows(tmp_path, capsys):
    from agentrl.cli import main

    assert check_env("skyrl_gym:gsm8k", {}, rows=gsm8k_rows()) == []
    assert check_env("skyrl_gym:gsm8k_multi_turn", {}, rows=gsm8k_rows()) == []
    assert check_env("skyrl_gym:text2sql", {"env_config": {"db_path": str(tmp_path)}}, rows=sql_rows(tmp_path)) == []
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in gsm8k_rows()))
    assert main(["check-env", "skyrl_gym:gsm8k", "--data", str(data)]) == 0
    assert main(["check-env", "skyrl_gym:gsm8k"]) == 1
    assert "set data.train" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not a SkyRL-Gym environment; the registered ones: aime"):
        make("skyrl_gym:nosuch")


def test_bad_rows_and_episodes_that_never_end_fail_their_episode_with_the_reason(tmp_path):
    env = make("skyrl_gym:gsm8k")
    assert "must end with a user message" in env.check_row({"prompt": [{"role": "assistant", "content": "x"}]})
    host = EnvHost("skyrl_gym:gsm8k_multi_turn", {"max_steps": 2}, call_timeout_s=30)
    never_ends = {**gsm8k_rows()[0], "extra_info": {"max_turns": 50}}  # SkyRL's env would go on for 50 turns
    assert host.handle("reset", "a", 0, never_ends).ok
    assert host.handle("step", "a", "#### 9").ok
    result = host.handle("step", "a", "#### 9")
    assert not result.ok and "did not end its episode within env.kwargs.max_steps=2" in result.error
    broken = EnvHost("skyrl_gym:gsm8k", {})
    result = broken.handle("reset", "b", 0, {"prompt": [{"role": "user", "content": "1 + 1?"}]})  # no reward_spec
    assert not result.ok and "reward_spec" in result.error
    assert broken.counts()["failed"] == 1 and host.counts()["failed"] == 1


# gsm8k's and text2sql's prompts are long: room for them, and a tokenizer of more pieces
SKYRL_RUN = {"rollout.max_turns": 3, "rollout.max_new_tokens": 12, "rollout.max_episode_tokens": 384}


@pytest.mark.parametrize("name", ["gsm8k", "text2sql"])
def test_two_training_steps_on_a_skyrl_env(name, tmp_path):
    rows = gsm8k_rows() if name == "gsm8k" else sql_rows(tmp_path / "db")
    kwargs = {} if name == "gsm8k" else {"env_config": {"db_path": str(tmp_path / "db")}}
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = {**SKYRL_RUN, "data.train": str(data), "model.tiny.vocab_size": 256}
    if name == "gsm8k":  # and the run's evaluation at its end, on the rows as data.val
        settings |= {"data.val": str(data), "eval.split": "val", "eval.every": 2, "eval.n": 1}
    logged = train(write_config(tmp_path, f"skyrl_gym:{name}", kwargs, **settings), timeout=400)
    assert_clean_steps(logged, steps=2, episodes=8)
    if name == "gsm8k":
        assert_evaluated(logged, step=2, episodes=len(rows))
