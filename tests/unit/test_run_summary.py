from agentrl.config import from_dict
from agentrl.run.summary import RunSummary, format_duration, resume_command, success_trend


def config(tmp_path, steps=100):
    return from_dict({"model": {"path": "m"}, "run_dir": str(tmp_path / "run"), "steps": steps})


def test_a_finished_run_says_how_far_how_well_and_where(tmp_path):
    success = {step: 0.25 if step < 10 else 0.5 if step < 90 else 0.75 for step in range(100)}
    text = RunSummary(config(tmp_path), 4, 0, 100, 372.4, ["agentrl", "train", "q.yaml"]).text(success, "")
    first, *rest = text.splitlines()
    assert first == "agentrl: finished: 100/100 steps in 6 min 12 s"
    assert "  success rate  0.25 (steps 0-9) -> 0.75 (steps 90-99)" in rest
    assert f"  tensorboard   tensorboard --logdir {tmp_path / 'run' / 'tb'}" in rest
    assert not any("continue" in line for line in rest)


def test_a_stopped_run_says_why_and_how_to_continue(tmp_path):
    text = RunSummary(config(tmp_path), 4, 20, 37, 50.0, ["agentrl", "train", "q.yaml", "resume=false", "seed=1"])
    text = text.text({step: 0.5 for step in range(20, 37)}, "SIGTERM on rank 1")
    assert text.startswith(
        "agentrl: stopped by signal at step 37, checkpoint written (SIGTERM on rank 1): "
        "37/100 steps in 50.0 s, resumed at step 20"
    )
    assert "  continue      mpirun -n 4 agentrl train q.yaml seed=1 resume=true" in text


def test_helpers():
    assert format_duration(7322) == "2 h 2 min"
    assert success_trend({}) is None
    assert success_trend({5: 1.0}) == "1.00 (step 5) -> 1.00 (step 5)"
    assert resume_command(["agentrl", "train", "c.yaml"], 1) == "agentrl train c.yaml resume=true"
