"""The trainer leader's console output when stderr is not a terminal (sbatch, a file): plain lines, no bar."""

from agentrl.tracking.run_logger import PLAIN_LINES, RunLogger


def test_without_a_terminal_the_progress_is_a_few_plain_lines(tmp_path, capsys):
    logger = RunLogger(str(tmp_path), total_steps=200, start_step=0, progress=True)
    assert logger.plain  # pytest captures stderr: not a terminal
    for step in range(200):
        logger.log(step, {"episode/success_rate": step / 200, "episode/reward_mean": 1.0})
    logger.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.strip().splitlines()
    assert len(lines) == PLAIN_LINES  # every 1/20 of the run, the last at its end
    assert lines[0].startswith("train step 10/200 ") and lines[-1].startswith("train step 200/200 ")
    assert "success=0.99" in lines[-1]


def test_a_resumed_run_counts_from_where_it_resumed(tmp_path, capsys):
    logger = RunLogger(str(tmp_path), total_steps=100, start_step=90, progress=True)
    for step in range(90, 100):
        logger.log(step, {"episode/reward_mean": 0.5})
    logger.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["train step 95/100 reward=0.500", "train step 100/100 reward=0.500"]
