"""Training from data under mpirun: rows reach the qa env, episode dumps, and a run killed in the middle that
resumes with the next unseen row, so that every row is trained exactly once per epoch."""

import json
import os
import signal

import pytest

from agentrl.data.episode_dump import dump_path, read_steps
from agentrl.data.loading import load_rows
from agentrl.data.tasks import DatasetTasks
from agentrl.errors import EXIT_USER_ERROR
from agentrl.trainer import checkpoint
from tests.mpi.helpers import assert_ok, finish, rank_pids, scalars, small_run, start_training, train, wait_for

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]

ROWS = 24
ROLLOUTS = 2
TASKS = 4  # per step, both rollout ranks together
STEPS_PER_EPOCH = ROWS // TASKS
STEPS = 2 * STEPS_PER_EPOCH
SEED = 3


def write_rows(path, count=ROWS, drop=None):
    rows = [{"id": f"r{i:02d}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(count)]
    path.write_text("".join(json.dumps({k: v for k, v in row.items() if k != drop}) + "\n" for row in rows))
    return path


def data_run(tmp_path, model_dir, rows, **extra) -> list[str]:
    settings = {
        "steps": STEPS,
        "seed": SEED,
        "layout.trainer": 1,
        "layout.rollout": ROLLOUTS,
        "layout.env": 1,
        "rollout.tasks_per_step": TASKS,
        "rollout.group_size": 2,
        "rollout.max_turns": 1,
        "rollout.max_new_tokens": 4,
        "rollout.dump_episodes": "true",
        "checkpoint.every": 4,
        "data.train": rows,
        "env.id": "qa",
        "env.kwargs": "{reward_fn: number_match}",
        **extra,
    }
    return small_run(tmp_path, model_dir, **settings)


def trained_ids(records: list[dict]) -> dict[int, str]:
    """{task index within the step: row id} of the step's trained groups."""
    return {r["group"]: r["task_id"] for r in records if r["trained"]}


def uninterrupted_order(rows_path) -> dict[int, dict[int, str]]:
    """The row ids each (step, task index) gets in a run that is never stopped, from the task sources themselves."""
    rows = load_rows(str(rows_path))
    share = TASKS // ROLLOUTS
    sources = [DatasetTasks(rows, str(rows_path), SEED, shard, ROLLOUTS) for shard in range(ROLLOUTS)]
    order = {}
    for step in range(STEPS):
        order[step] = {}
        for shard, source in enumerate(sources):
            indices = [shard * share + j for j in range(share)]
            order[step].update({i: t.id for i, t in zip(indices, source.take(step, indices), strict=True)})
    return order


def test_a_rank_killed_mid_run_resumes_with_the_next_unseen_row(tmp_path, tiny_model_dir):
    rows = write_rows(tmp_path / "rows.jsonl")
    run = tmp_path / "run"
    overrides = data_run(tmp_path, tiny_model_dir, rows)
    job = start_training(4, overrides)
    wait_for(lambda: 2 in rank_pids(run), 400, job, "the second rollout rank")
    victim = rank_pids(run)[2]
    # Past the checkpoint of step 4: step 5's episodes are dumped, and the checkpoint of step 8 is two whole steps
    # off. A step can take 0.1 s on a quick machine, so the kill follows the dump within a short poll.
    wait_for(lambda: dump_path(run, 5).exists(), 400, job, "the episode dump of step 5", poll_s=0.005)
    os.kill(victim, signal.SIGKILL)  # the second rollout rank
    out, err = finish(job, 120, "the job after a rank was killed")
    assert job.returncode != 0, out + err[-3000:]
    resumed_at = checkpoint.latest(run)[0]
    dumped_before = sorted(read_steps(run))
    assert dumped_before[-1] >= resumed_at, (resumed_at, dumped_before)  # dumps past the checkpoint exist

    result = train(4, [*overrides, "resume=true"], timeout=500)
    assert_ok(result)
    assert f"resuming from {checkpoint.step_path(run, resumed_at)}" in result.stdout
    assert f"episode dump(s) of steps from {resumed_at} on" in result.stdout  # removed, then redone

    dumps = read_steps(run)
    assert sorted(dumps) == list(range(STEPS))
    assert all(len(records) == TASKS * 2 for records in dumps.values())  # every episode, once
    trained = {step: trained_ids(records) for step, records in dumps.items()}
    all_ids = sorted(f"r{i:02d}" for i in range(ROWS))
    for epoch in range(STEPS // STEPS_PER_EPOCH):
        steps = range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH)
        assert sorted(row for step in steps for row in trained[step].values()) == all_ids, f"epoch {epoch}"
    assert trained == uninterrupted_order(rows)  # not only each row once: exactly the stream of a run never stopped
    print(f"\nkilled past checkpoint {resumed_at}, dumps of steps {dumped_before}; {ROWS} rows x 2 epochs trained")

    record = dumps[0][0]
    row_number = int(record["task_id"][1:])
    assert record["messages"][0] == {"role": "user", "content": f"What is {row_number} + 1?"}
    assert record["messages"][1]["role"] == "assistant" and record["step"] == 0 and record["turns"] == 1

    logged = scalars(run)
    assert sorted(step for step, _ in logged["train/loss"]) == list(range(STEPS))  # none lost, none twice
    epochs = dict(logged["data/epoch"])
    assert epochs[STEPS_PER_EPOCH - 1] == 1.0 and epochs[STEPS - 1] == 2.0


@pytest.mark.parametrize(
    "case, count, drop, message",
    [
        ("column", ROWS, "answer", "rows.jsonl' has no column(s) 'answer', which env 'qa' needs"),
        ("size", 3, None, "rows.jsonl' has 3 row(s), fewer than one step's tasks (rollout.tasks_per_step=4)"),
    ],
)
def test_bad_rows_stop_the_run_with_one_message_naming_the_file(tmp_path, tiny_model_dir, case, count, drop, message):
    rows = write_rows(tmp_path / "rows.jsonl", count, drop)
    result = train(4, data_run(tmp_path, tiny_model_dir, rows), timeout=200)
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_USER_ERROR, output[-4000:]
    assert output.count(message) == 1, output[-4000:]
    assert not (tmp_path / "run").exists()  # refused before anything was written
