"""episodes-to-sft: which dumped episodes become transcripts, and the errors for bad dumps; SFT config errors."""

import json
import subprocess
import sys

import pytest

from agentrl.errors import UserError
from agentrl.sft.config import load_sft_config
from agentrl.sft.data import read_transcripts
from agentrl.sft.episodes import dump_files, episodes_to_sft
from tests.conftest import ROOT


def episode(task_id, reward, success, finish="terminated", **extra):
    messages = [{"role": "user", "content": f"task {task_id}"}, {"role": "assistant", "content": str(reward)}]
    return {
        "task_id": task_id,
        "step": 0,
        "weight_version": 0,
        "reward": reward,
        "success": success,
        "finish": finish,
        "turns": 1,
        "messages": messages,
        **extra,
    }


def write(folder, name, episodes):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(e) + "\n" for e in episodes))


@pytest.fixture
def dumps(tmp_path):
    folder = tmp_path / "episodes"
    write(folder, "step_000010.jsonl", [episode(3, 1.0, True), episode(4, 0.2, False)])
    write(folder, "step_000002.rank1.jsonl", [episode(1, 0.5, True, data_source="gsm8k")])
    write(folder, "step_000002.rank0.jsonl", [episode(0, 1.0, True, finish="error"), episode(2, 0.0, False)])
    (folder / "notes.txt").write_text("not a dump")
    return folder


def test_files_in_step_then_rank_order(dumps):
    assert [p.name for p in dump_files(dumps)] == [
        "step_000002.rank0.jsonl",
        "step_000002.rank1.jsonl",
        "step_000010.jsonl",
    ]


def test_success_only_by_default_never_failed_ones(dumps, tmp_path):
    out = tmp_path / "sft.jsonl"
    report = episodes_to_sft(dumps, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["task_id"] for row in rows] == [1, 3]
    assert rows[0]["data_source"] == "gsm8k" and rows[0]["source"].endswith("step_000002.rank1.jsonl:1")
    assert (report.kept, report.episodes, report.failed, report.not_successful) == (2, 5, 1, 2)
    assert len(read_transcripts(out)) == 2  # the output is valid SFT data

    report = episodes_to_sft(dumps, out, min_reward=0.8)
    assert [json.loads(line)["task_id"] for line in out.read_text().splitlines()] == [3]
    assert report.below_reward == 1
    episodes_to_sft(dumps, out, success_only=False)
    assert [json.loads(line)["task_id"] for line in out.read_text().splitlines()] == [2, 1, 3, 4]


def test_bad_dumps_are_named(tmp_path):
    with pytest.raises(UserError, match="is not a folder"):
        episodes_to_sft(tmp_path / "nothing", tmp_path / "out.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no step_NNNNNN\.jsonl"):
        episodes_to_sft(tmp_path / "empty", tmp_path / "out.jsonl")
    folder = tmp_path / "bad"
    write(folder, "step_000001.jsonl", [episode(1, 1.0, True)])
    with (folder / "step_000001.jsonl").open("a") as handle:
        handle.write("{oops\n")
    with pytest.raises(UserError, match=r"step_000001.jsonl:2: not valid JSON"):
        episodes_to_sft(folder, tmp_path / "out.jsonl")
    bad_roles = episode(2, 1.0, True)
    bad_roles["messages"] = [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]
    write(folder, "step_000001.jsonl", [bad_roles])
    with pytest.raises(UserError, match=r"step_000001.jsonl:1: message 1 is a tool message"):
        episodes_to_sft(folder, tmp_path / "out.jsonl")
    write(folder, "step_000001.jsonl", [episode(2, 0.0, False)])
    with pytest.raises(UserError, match=r"no episode .* passed the filter"):
        episodes_to_sft(folder, tmp_path / "out.jsonl")


def test_sft_config_errors_name_the_field(tmp_path):
    config = load_sft_config(ROOT / "launch/configs/sft_example.yaml")
    assert config.sft.train == "examples/sft/calculator_train.jsonl" and config.optimizer.lr == 0.003
    with pytest.raises(UserError, match=r"sft.max_seq_len: Input should be greater than or equal to 8"):
        load_sft_config(ROOT / "launch/configs/sft_example.yaml", ["sft.max_seq_len=4"])
    with pytest.raises(UserError, match=r"sft.epochs: Input should be greater than or equal to 1"):
        load_sft_config(ROOT / "launch/configs/sft_example.yaml", ["sft.epochs=0"])
    with pytest.raises(UserError, match=r"sft.trian: unknown field"):
        load_sft_config(ROOT / "launch/configs/sft_example.yaml", ["sft.trian=x.jsonl"])


def test_cli_names_the_bad_line_and_exits_2(tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n[1, 2]\n')
    command = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "sft",
        str(ROOT / "launch/configs/sft_example.yaml"),
        f"run_dir={tmp_path / 'run'}",
        f"sft.train={data}",
        "sft.val=null",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert f'agentrl: {data}:2: no "messages" key (found: list)' in result.stderr
    assert "Traceback" not in result.stderr
