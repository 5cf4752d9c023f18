"""Evaluation under mpirun: eval during training (every 2 steps and before training) leaves training bit-identical,
`agentrl eval` of the final checkpoint on another layout reports what the run logged, a val-dataset eval with the
qa env, and bad input refused with one message."""

import json

import pytest

from agentrl.errors import EXIT_USER_ERROR
from tests.conftest import ROOT
from tests.mpi.helpers import assert_ok, mpirun, scalars, small_run, train

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]

STEPS = 4
EVAL = {
    "eval.every": 2,
    "eval.before_train": "true",
    "eval.seeds": "[100,6]",
    "eval.n": 4,
    "eval.temperature": 1.0,
}


def layout(rollout: int = 2, env: int = 1) -> dict:
    return {"layout.trainer": 1, "layout.rollout": rollout, "layout.env": env}


def run_settings(tmp_path, model_dir, name, **extra) -> list[str]:
    return small_run(tmp_path, model_dir, run_dir=tmp_path / name, steps=STEPS, **layout(), **extra)


def evaluate(n: int, args: list[str], timeout: float = 300):
    return mpirun(n, ["-m", "agentrl.cli", "eval", *args], timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """The same 4-rank run with and without evaluation."""
    tmp_path = tmp_path_factory.mktemp("eval")
    with_eval = train(4, run_settings(tmp_path, tiny_model_dir, "with_eval", **EVAL), timeout=400)
    assert_ok(with_eval)
    plain = train(4, run_settings(tmp_path, tiny_model_dir, "plain"), timeout=400)
    assert_ok(plain)
    return tmp_path, with_eval.stdout


def test_eval_every_2_steps_logs_at_the_right_steps_and_training_is_bit_identical(runs):
    tmp_path, stdout = runs
    evaluated, plain = scalars(tmp_path / "with_eval"), scalars(tmp_path / "plain")
    eval_tags = {tag for tag in evaluated if tag.startswith("eval/")}
    for name in ("success", "reward_mean", "pass@1", "pass@2", "pass@4", "mean@4", "turns_mean", "tokens_mean"):
        assert f"eval/{name}" in eval_tags
        assert [step for step, _ in evaluated[f"eval/{name}"]] == [0, 2, 4]  # before training, every 2, the end
    assert {value for _, value in evaluated["eval/episodes"]} == {6 * 4}
    training_tags = [tag for tag in plain if tag.startswith(("episode/", "train/", "rollout/"))]
    assert "train/loss" in training_tags and "episode/reward_mean" in training_tags
    for tag in training_tags:
        assert evaluated[tag] == plain[tag], f"{tag} differs with evaluation on"
    assert not any(tag.startswith("eval/") for tag in plain)
    for step in (0, 2, 4):
        report = json.loads((tmp_path / "with_eval" / "eval" / f"step_{step:06d}.json").read_text())
        assert len(report["tasks"]) == 6 and all(len(t["successes"]) == 4 for t in report["tasks"])
        assert report["metrics"]["success"] == pytest.approx(dict(evaluated["eval/success"])[step])
    assert "eval at step 4:" in stdout


def test_agentrl_eval_of_the_last_checkpoint_reports_what_the_run_logged(runs):
    tmp_path, _ = runs
    run = tmp_path / "with_eval"
    out = tmp_path / "eval_out"
    args = [str(ROOT / "launch/configs/quickstart.yaml"), "--checkpoint", str(run / "checkpoints" / "step_000004")]
    args += ["--out", str(out), "--dump", f"run_dir={run}", "checkpoint.every=0", "logging.progress=false"]
    args += [f"{key}={value}" for key, value in {**EVAL, **layout(rollout=1, env=1)}.items()]
    result = evaluate(3, args)  # another layout than training's: one rollout rank
    assert_ok(result)
    report = json.loads((out / "report.json").read_text())
    assert report["step"] == 4 and report["model"].endswith("step_000004")
    logged = scalars(out)
    assert set(logged) == {f"eval/{name}" for name in report["metrics"]}
    for name, value in report["metrics"].items():
        assert logged[f"eval/{name}"] == [(4, pytest.approx(value))]
    # the same episodes as the run's own evaluation at step 4: eval's seeds depend on neither layout nor batching
    during_run = json.loads((run / "eval" / "step_000004.json").read_text())
    for name in ("success", "reward_mean", "pass@1", "pass@2", "pass@4", "turns_mean", "tokens_mean"):
        assert report["metrics"][name] == pytest.approx(during_run["metrics"][name]), name
    assert [t["rewards"] for t in report["tasks"]] == [t["rewards"] for t in during_run["tasks"]]
    dumped = [json.loads(line) for line in (out / "episodes" / "step_000004.jsonl").read_text().splitlines()]
    assert len(dumped) == 6 * 4 and {d["weight_version"] for d in dumped} == {4}
    assert "success" in result.stdout and "pass@4" in result.stdout  # the table


def test_val_dataset_eval_with_the_qa_env(tmp_path, tiny_model_dir):
    config = str(ROOT / "launch/configs/qa_arith.yaml")
    out = tmp_path / "qa"
    args = [config, "--checkpoint", str(tiny_model_dir), "--out", str(out), f"run_dir={tmp_path / 'run'}"]
    args += ["eval.max_tasks=12", "eval.n=2", "eval.temperature=1.0", "rollout.max_new_tokens=6"]
    args += ["layout.trainer=1", "layout.rollout=2", "layout.env=0"]
    result = evaluate(3, args)
    assert_ok(result)
    report = json.loads((out / "report.json").read_text())
    val_ids = [json.loads(line)["id"] for line in (ROOT / "launch/data/arith_val.jsonl").read_text().splitlines()]
    assert [t["task_id"] for t in report["tasks"]] == val_ids[:12]
    assert "arith_val.jsonl (12 of 64 rows)" in report["split"]
    metrics = report["metrics"]
    assert metrics["tasks"] == 12 and metrics["episodes"] == 24
    assert "tool_call_rate" in metrics and "tool_calls_mean" in metrics  # the qa env offers a calculator
    assert {"source/sum/success", "source/compare/success"} <= set(metrics)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--checkpoint", "{tmp}"], "is not a model folder: it has no config.json"),
        (["--checkpoint", "{tmp}/nothing"], "no such folder"),
        (["eval.split=val"], "eval.split=val evaluates the rows of data.val, but data.val is not set"),
        (["eval.n=0"], "eval.n: samples per task must be at least 1"),
    ],
)
def test_bad_eval_input_is_one_message(tmp_path, tiny_model_dir, extra, message):
    args = [str(ROOT / "launch/configs/quickstart.yaml"), *(e.format(tmp=tmp_path) for e in extra)]
    args += [f"model.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", *(f"{k}={v}" for k, v in layout().items())]
    result = evaluate(4, args, timeout=120)
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-3000:]
    assert message in result.stderr
    assert result.stderr.count(message) == 1  # said once, by rank 0
    assert "Traceback" not in result.stderr


def test_in_one_process_eval_leaves_training_bit_identical_and_agentrl_eval_agrees(tmp_path, tiny_model_dir):
    import subprocess

    from tests.mpi.helpers import job_env, rank_command

    def alone(args: list[str]) -> subprocess.CompletedProcess:
        command = [*rank_command(), "-m", "agentrl.cli", *args]
        return subprocess.run(command, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=300)

    quickstart = str(ROOT / "launch/configs/quickstart.yaml")
    settings = {"eval.every": 1, "eval.seeds": "[7,4]", "eval.n": 2, "eval.temperature": 1.0, "steps": 2}
    with_eval = small_run(tmp_path, tiny_model_dir, run_dir=tmp_path / "a", **settings)
    assert_ok(alone(["train", quickstart, *with_eval]))
    assert_ok(alone(["train", quickstart, *small_run(tmp_path, tiny_model_dir, run_dir=tmp_path / "b", steps=2)]))
    evaluated, plain = scalars(tmp_path / "a"), scalars(tmp_path / "b")
    assert [step for step, _ in evaluated["eval/pass@2"]] == [1, 2]
    for tag in (t for t in plain if t.startswith(("episode/", "train/"))):
        assert evaluated[tag] == plain[tag], tag
    args = ["eval", quickstart, "--checkpoint", str(tmp_path / "a"), f"run_dir={tmp_path / 'a'}"]
    args += [f"{key}={value}" for key, value in settings.items() if key.startswith("eval.")]
    result = alone(args)
    assert_ok(result)
    assert "evaluating its newest checkpoint" in result.stdout
    report = json.loads((tmp_path / "a" / "eval" / "checkpoint_step_000002" / "report.json").read_text())
    during_run = json.loads((tmp_path / "a" / "eval" / "step_000002.json").read_text())
    assert [t["rewards"] for t in report["tasks"]] == [t["rewards"] for t in during_run["tasks"]]
