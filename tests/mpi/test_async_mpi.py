"""Asynchronous rollouts under mpirun: the staleness bound over a whole run, checked on every trained episode's
per-turn weight versions; a stop with batches generated ahead that resumes losing and repeating nothing."""

import os
import signal

import pytest

from agentrl.data.episode_dump import dump_path, read_steps
from agentrl.layout import Role, pinned_cores
from agentrl.run.preempt import EXIT_STOPPED
from agentrl.trainer import checkpoint
from tests.mpi.helpers import assert_ok, finish, scalars, small_run, start_training, train, wait_for
from tests.mpi.test_data_mpi import STEPS, TASKS, data_run, trained_ids, uninterrupted_order, write_rows

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]


def test_the_staleness_bound_holds_over_a_whole_run(tmp_path, tiny_model_dir):
    ahead, steps = 2, 10
    run = tmp_path / "run"
    overrides = small_run(
        tmp_path,
        tiny_model_dir,
        steps=steps,
        **{
            "layout.rollout": 2,
            "layout.env": 1,
            "rollout.max_staleness": ahead,
            "rollout.dump_episodes": "true",
            "eval.every": 5,  # evaluation steps are sync points: on exactly their step's weights
            "eval.seeds": "[1000000,8]",
            "runtime.pin_cores": "true",  # the trainer on a core of its own, the other ranks on the rest
            "runtime.yield_to_trainer": "auto",  # and the others at a lower priority where ranks outnumber cores
        },
    )
    result = train(4, overrides, timeout=400)
    assert_ok(result)
    assert "clipped ratio is taken against the rollout's own log-probs" in result.stdout  # weighted and bounded
    cores, roles = sorted(os.sched_getaffinity(0)), [Role.TRAINER, Role.ROLLOUT, Role.ROLLOUT, Role.ENV]
    if len(cores) >= 2:
        trainer, others = pinned_cores(cores, roles, Role.TRAINER), pinned_cores(cores, roles, Role.ENV)
        assert f"runtime.pin_cores: trainer ranks on cores {trainer}, the others on {others}" in result.stdout
    if len(cores) < 4:  # auto: running ahead on more ranks than cores
        assert "runtime.yield_to_trainer: the other ranks on this node run at nice +10" in result.stdout

    dumps = read_steps(run)
    assert sorted(dumps) == list(range(steps))
    lags = []
    for step, records in dumps.items():
        for record in records:
            versions = record["turn_versions"]
            assert versions and versions == sorted(versions), record
            assert all(step - ahead <= v <= step for v in versions), (step, versions)
            assert record["weight_version"] == versions[0]
            lags.append(step - versions[0])
    assert max(lags) >= 1, "no episode was generated ahead: the run was synchronous"

    logged = scalars(run)
    assert sorted(s for s, _ in logged["train/loss"]) == list(range(steps))
    assert all(value == 0 for _, value in logged["async/dropped_stale"])
    assert all(0 <= value <= ahead for _, value in logged["async/lag_max"])
    assert max(value for _, value in logged["async/lag_mean"]) > 0
    assert [s for s, _ in logged["eval/episodes"]] == [5, 10]
    assert "train/mismatch_kl_k3" in logged and "time/rollout_idle" in logged


def test_k0_is_the_synchronous_schedule(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    overrides = small_run(tmp_path, tiny_model_dir, steps=4, **{"rollout.dump_episodes": "true"})
    assert_ok(train(2, overrides, timeout=300))
    for step, records in read_steps(run).items():
        assert {v for record in records for v in record["turn_versions"]} == {step}
    assert all(value == 0 for _, value in scalars(run)["async/lag_max"])


def test_a_stop_with_batches_generated_ahead_resumes_losing_and_repeating_nothing(tmp_path, tiny_model_dir):
    rows = write_rows(tmp_path / "rows.jsonl")
    run = tmp_path / "run"
    slow_trainer = {"trainer.updates_per_step": 4, "trainer.micro_batch_size": 1}  # so rollouts are ahead at the stop
    overrides = data_run(
        tmp_path, tiny_model_dir, rows, **{"rollout.max_staleness": 2, "checkpoint.every": 0, **slow_trainer}
    )
    job = start_training(4, overrides)
    wait_for(lambda: dump_path(run, 3).exists(), 400, job, "the episode dump of step 3")
    job.send_signal(signal.SIGUSR1)  # to mpirun, which forwards it to every rank
    out, err = finish(job, 120, "the job after SIGUSR1")
    assert job.returncode == EXIT_STOPPED, f"exit {job.returncode}\n{out[-3000:]}\n{err[-4000:]}"
    stopped_at = checkpoint.latest(run)[0]
    assert 3 <= stopped_at < STEPS
    assert sorted(read_steps(run)) == list(range(stopped_at))  # nothing generated ahead was trained or dumped
    assert f"batch(es) generated ahead of step {stopped_at}; a resumed run generates their tasks again" in out

    result = train(4, [*overrides, "resume=true"], timeout=500)
    assert_ok(result)
    dumps = read_steps(run)
    assert sorted(dumps) == list(range(STEPS))
    assert all(len(records) == TASKS * 2 for records in dumps.values())
    trained = {step: trained_ids(records) for step, records in dumps.items()}
    assert trained == uninterrupted_order(rows)  # each row once per epoch, in the order of a run never stopped
    assert sorted(s for s, _ in scalars(run)["train/loss"]) == list(range(STEPS))


def test_dynamic_dispatch_running_ahead_with_whole_episode_versions_finishes(tmp_path, tiny_model_dir):
    # rollout.partial_rollouts=false: every episode on one weight version. Ranks that took new weights only between
    # their steps hung in 3 runs of 6 of this test: one in the weight handoff, rank 0 serving a step that waited for
    # that rank's verdicts. A rank now takes them mid-step while none of its groups runs.
    ahead, steps = 2, 16
    run = tmp_path / "run"
    settings = {
        "steps": steps,
        "rollout.dispatch": "dynamic",
        "rollout.tasks_per_step": 3,
        "rollout.max_staleness": ahead,
        "rollout.partial_rollouts": "false",
        "trainer.updates_per_step": 4,  # a slow trainer: the rollout ranks run ahead
        "trainer.micro_batch_size": 1,
    }
    assert_ok(train(4, data_run(tmp_path, tiny_model_dir, write_rows(tmp_path / "rows.jsonl"), **settings), 300))
    dumps = read_steps(run)
    assert sorted(dumps) == list(range(steps))
    records = [record for step_records in dumps.values() for record in step_records]
    for step, step_records in dumps.items():
        for record in step_records:
            versions = record["turn_versions"]
            assert len(set(versions)) == 1 and step - ahead <= versions[0] <= step, (step, record)
    assert any(record["step"] > record["weight_version"] for record in records), "nothing ran ahead"
    assert {record["rollout_rank"] for record in records} == {0, 1}
    assert sorted(s for s, _ in scalars(run)["train/loss"]) == list(range(steps))
