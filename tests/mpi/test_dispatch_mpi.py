"""Dynamic task dispatch under mpirun: a rank beside a slow env runs fewer groups; dataset rows are each
trained once per epoch, in the queue's order, across a stop with batches generated ahead and a resume."""

import signal
from collections import Counter

import pytest

from agentrl.data.episode_dump import dump_path, read_steps
from agentrl.data.loading import load_rows
from agentrl.data.tasks import DatasetTasks, task_seed
from agentrl.run.preempt import EXIT_STOPPED
from agentrl.trainer import checkpoint
from tests.mpi.helpers import assert_ok, finish, scalars, script, small_run, start_training, train, wait_for
from tests.mpi.test_data_mpi import ROWS, SEED, data_run, trained_ids, write_rows

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]

TASKS = 3  # not a multiple of the 2 rollout ranks: only dynamic dispatch allows it
STEPS_PER_EPOCH = ROWS // TASKS
STEPS = 2 * STEPS_PER_EPOCH


@pytest.mark.parametrize("scheduler", ["batch", "continuous"])  # continuous: rank 0 answers claims between its steps
def test_the_rank_beside_a_slow_env_runs_fewer_groups(tmp_path, tiny_model_dir, scheduler):
    run, steps = tmp_path / "run", 4
    overrides = small_run(
        tmp_path,
        tiny_model_dir,
        steps=steps,
        **{
            "layout.rollout": 2,
            "rollout.tasks_per_step": 8,
            "rollout.group_size": 2,
            "rollout.dispatch": "dynamic",
            "rollout.engine.scheduler": scheduler,
            "rollout.groups_in_flight": 1,
            "rollout.dump_episodes": "true",
            "env.id": "tests.fault_envs:SlowOnRankEnv",
            "env.kwargs": "{rank: 2, delay_s: 0.1}",  # world rank 2 is rollout rank 1
        },
    )
    assert_ok(train(3, overrides, timeout=400))
    dumps = read_steps(run)
    assert sorted(dumps) == list(range(steps))
    for records in dumps.values():
        assert sorted({r["group"] for r in records}) == list(range(8))  # the step's tasks, each once
        assert Counter(r["group"] for r in records) == dict.fromkeys(range(8), 2)
    groups = Counter(r["rollout_rank"] for records in dumps.values() for r in records)
    assert groups[0] > 2 * groups[1] > 0, groups  # both ran tasks; the fast rank ran most
    logged = scalars(run)
    assert all(
        low < high
        for (_, low), (_, high) in zip(
            logged["rollout/rank_groups_min"], logged["rollout/rank_groups_max"], strict=True
        )
    )
    assert "time/rollout_spread" in logged


def test_after_a_stop_mid_step_closing_the_queue_leaves_no_message_for_mpi_finalize():
    # MPICH's MPI_Finalize fails on a message never received; left to mpi4py's exit hook, the rank then left
    # without a word and mpirun killed the others (exit 9 instead of 75 after a stop).
    result = script(3, "dispatch_close.py", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    out = result.stdout
    assert "rank 0: held 1, later 1, gone [1]" in out  # rank 1 left mid-step; rank 2's two claims unanswered
    assert "rank 1: dropped 1 answers" in out and "rank 2: dropped 2 answers" in out
    assert all(f"rank {rank}: finalized" in out for rank in range(3)), out


def queue_order(rows_path) -> dict[int, dict[int, str]]:
    """The row ids each (step, task index) gets from the dispatcher's one walk over the rows."""
    source = DatasetTasks(load_rows(str(rows_path)), str(rows_path), SEED, 0, 1)
    return {step: {i: t.id for i, t in enumerate(source.take(step, list(range(TASKS))))} for step in range(STEPS)}


@pytest.mark.parametrize("ahead", [0, 2])
def test_a_stop_and_resume_train_every_row_once_per_epoch_in_the_queues_order(tmp_path, tiny_model_dir, ahead):
    rows = write_rows(tmp_path / "rows.jsonl")
    run = tmp_path / "run"
    slow_trainer = {"trainer.updates_per_step": 4, "trainer.micro_batch_size": 1}  # rollouts run ahead at the stop
    settings = {"rollout.dispatch": "dynamic", "rollout.tasks_per_step": TASKS, "steps": STEPS, "checkpoint.every": 0}
    overrides = data_run(
        tmp_path,
        tiny_model_dir,
        rows,
        **settings,
        **({"rollout.max_staleness": ahead, **slow_trainer} if ahead else {}),
    )
    job = start_training(4, overrides)
    wait_for(lambda: dump_path(run, 3).exists(), 400, job, "the episode dump of step 3")
    job.send_signal(signal.SIGUSR1)
    out, err = finish(job, 120, "the job after SIGUSR1")
    assert job.returncode == EXIT_STOPPED, f"exit {job.returncode}\n{out[-3000:]}\n{err[-4000:]}"
    stopped_at = checkpoint.latest(run)[0]
    assert 3 <= stopped_at < STEPS

    assert_ok(train(4, [*overrides, "resume=true"], timeout=500))
    dumps = read_steps(run)
    assert sorted(dumps) == list(range(STEPS))
    trained = {step: trained_ids(records) for step, records in dumps.items()}
    assert trained == queue_order(rows)  # each row once per epoch, as a run never stopped would train them
    ranks = Counter(r["rollout_rank"] for records in dumps.values() for r in records)
    assert set(ranks) == {0, 1}, ranks
    assert sorted(s for s, _ in scalars(run)["train/loss"]) == list(range(STEPS))


@pytest.mark.parametrize("ranks", [1, 4])
def test_dapo_claims_replacements_for_dropped_groups_from_the_one_queue(tmp_path, tiny_model_dir, ranks):
    # tests.signal_envs: even task seeds give groups without signal, which DAPO drops. The queue hands out task
    # indices 0, 1, 2, ... only while the step may still be short, so each step issues the shortest prefix of
    # indices holding 4 odd seeds (or the budget, 3 x 4 tasks), whichever rank ran them.
    settings = {
        "seed": 0,
        "rollout.tasks_per_step": 4,
        "rollout.dispatch": "dynamic",
        "env.id": "tests.signal_envs:SeedParityEnv",
        "env.kwargs": "{turns: 2}",
        "algorithm.name": "dapo",
        "algorithm.max_extra_rounds": 2,
        **({"layout.trainer": 2, "layout.rollout": 2} if ranks == 4 else {}),
    }
    assert_ok(train(ranks, small_run(tmp_path, tiny_model_dir, **settings), timeout=300))
    logged = scalars(tmp_path / "run")
    for step in range(3):
        odd = [index for index in range(12) if task_seed(0, step, index) % 2]
        issued = odd[3] + 1 if len(odd) >= 4 else 12
        kept = min(4, len(odd))
        assert dict(logged["episode/groups"])[step] == kept, step
        assert dict(logged["rollout/dropped_groups"])[step] == issued - kept, step
        assert dict(logged["rollout/groups_short"])[step] == 4 - kept, step
        assert dict(logged["rollout/extra_rounds"])[step] == -(-(issued - 4) // 4), step
        assert dict(logged["episode/zero_signal_groups"])[step] == 0
