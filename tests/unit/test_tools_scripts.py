"""The scripts in tools/ run from the repository root with their documented command lines, on real run outputs."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def run_tool(*args: str) -> str:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_curve_prints_the_mean_min_and_max_of_each_window_and_the_elapsed_time(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(10):
        writer.add_scalar("episode/success_rate", step / 10, step)
        writer.add_scalar("time/step", 2.0, step)
    writer.close()
    out = run_tool("tools/curve.py", str(tmp_path), "--window", "5")
    rows = [line.split() for line in out.splitlines() if re.match(r"\s*\d+-\d+", line)]
    assert rows == [
        ["0-4", "0.200", "0.000", "0.400", "10"],
        ["5-9", "0.700", "0.500", "0.900", "20"],
    ]


def test_quickstart_policy_plays_every_secret_greedily_and_counts_the_wins(tiny_model_dir):
    out = run_tool("tools/quickstart_policy.py", str(tiny_model_dir), "--low", "1", "--high", "10", "--guesses", "4")
    games = [line for line in out.splitlines() if re.match(r"\d+\s+(win|lose)\s", line)]
    assert [int(line.split()[0]) for line in games] == list(range(1, 11))
    assert all(re.search(r"\(1,10\) -> \S* : [01]\.\d\d", line) for line in games)  # the opening, with its probability
    won = sum(line.split()[1] == "win" for line in games)
    assert f"greedy: {won} of 10 games won" in out
