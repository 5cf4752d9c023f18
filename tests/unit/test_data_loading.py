"""data.train/val: jsonl, parquet and save_to_disk folders load through `datasets`; bad input names the path,
the row and the fix."""

import json

import datasets
import pytest

from agentrl.data.loading import load_rows
from agentrl.env.row_checks import check_rows
from agentrl.errors import UserError
from envs.qa import QAEnv

ROWS = [{"id": f"r{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_jsonl_parquet_and_a_saved_folder_give_the_same_rows(tmp_path):
    jsonl = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    parquet = tmp_path / "rows.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(parquet))
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    for spec in (jsonl, parquet, tmp_path / "saved"):
        assert list(load_rows(str(spec))) == ROWS


def test_paths_that_name_no_rows_are_user_errors_naming_them(tmp_path):
    with pytest.raises(UserError, match=r"data.train='missing/rows.jsonl': no such file"):
        load_rows("missing/rows.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(UserError, match=r"rows.csv' is a .csv file; agentrl reads .jsonl"):
        load_rows(str(tmp_path / "rows.csv"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(UserError, match=r"not one written by `datasets.save_to_disk`"):
        load_rows(str(tmp_path / "plain"), "data.val")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(UserError, match=r"holds several splits \(train\); name one split's folder"):
        load_rows(str(tmp_path / "dict"))
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{"prompt": \n')
    with pytest.raises(UserError, match=r"broken.jsonl' cannot be read as .jsonl rows"):
        load_rows(str(tmp_path / "broken.jsonl"))


def test_a_missing_column_a_rejected_row_and_too_few_rows_name_the_file_and_the_row(tmp_path):
    env = QAEnv()
    no_answer = load_rows(str(write_jsonl(tmp_path / "a.jsonl", [{"prompt": "q"}] * 4)))
    with pytest.raises(UserError, match=r"a.jsonl' has no column\(s\) 'answer', which env 'qa' needs"):
        check_rows(no_answer, str(tmp_path / "a.jsonl"), env, "qa", 2)
    bad = [*ROWS[:3], {"id": "r3", "prompt": "", "answer": "1"}, *ROWS[4:]]
    spec = str(write_jsonl(tmp_path / "b.jsonl", bad))
    with pytest.raises(UserError, match=r"b.jsonl' row 3 \(id 'r3'\): env 'qa' rejects it: its prompt is empty"):
        check_rows(load_rows(spec), spec, env, "qa", 2)
    gap = [*ROWS[:2], {"id": "r2", "prompt": "q", "answer": None}]
    spec = str(write_jsonl(tmp_path / "c.jsonl", gap))
    with pytest.raises(UserError, match=r"row 2 \(id 'r2'\): env 'qa' rejects it: its answer is missing"):
        check_rows(load_rows(spec), spec, env, "qa", 2)
    with pytest.raises(UserError, match=r"has 6 row\(s\), fewer than one step's tasks \(rollout.tasks_per_step=8\)"):
        check_rows(load_rows(str(tmp_path / "a.jsonl").replace("a.jsonl", "b.jsonl")), "b", env, "qa", 8)


def test_the_run_check_covers_data_val_too(tmp_path):
    from agentrl.config import from_dict
    from agentrl.env.row_checks import check_training_rows

    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    val = write_jsonl(tmp_path / "val.jsonl", [{"id": "v0", "prompt": "q"}, {"id": "v1", "prompt": "q"}])
    config = from_dict(
        {
            "model": {"path": "unused"},
            "env": {"id": "qa"},
            "rollout": {"tasks_per_step": 2},
            "data": {"train": str(train), "val": str(val)},
        }
    )
    with pytest.raises(UserError, match=r"data.val='.*val.jsonl' has no column\(s\) 'answer'"):
        check_training_rows(config)
    config.data.val = None
    assert check_training_rows(config) == ROWS[0]
