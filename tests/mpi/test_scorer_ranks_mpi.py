"""Real `mpirun` runs with scorer ranks (layout.scorer): a reward model, or a tiny judge run by the engine, loaded
once on a scorer rank, scores the episodes of every rollout rank and the trainer trains on them; a scorer whose
every score fails stops the run at its first step with the reason, and a scorer rank killed mid-run ends the job
instead of leaving it waiting."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests.mpi.helpers import assert_ok, finish, rank_pids, scalars, small_run, start_training, train, wait_for

pytestmark = pytest.mark.mpi

STEPS = 2
EPISODES = 16  # per step: small_run's 4 tasks x 4
SUMMARY = re.compile(
    r"agentrl: scorer rank (\d+), (.+?): (\d+) episodes in (\d+) requests, (\d+) answered from the cache or a same "
    r"text in flight; "
    r"(\d+) scoring batches .* of (\S+) episodes on average, (\d+) of them with episodes of 2 or more rollout ranks; "
    r"(\d+) failed"
)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from tests.unit.test_reward_model import build_reward_model

    return build_reward_model(tmp_path_factory.mktemp("reward_model"))


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    from tests.unit.tiny_judge import build_tiny_judge

    return build_tiny_judge(tmp_path_factory.mktemp("judge"))


def scorer_run(tmp_path, model_dir, rollout: int, **extra) -> list[str]:
    settings = {"steps": STEPS, "layout.rollout": rollout, "layout.scorer": 1, "runtime.env_step_timeout_s": 60}
    return small_run(tmp_path, model_dir, **settings, **extra)


def test_a_reward_model_on_a_scorer_rank_scores_both_rollout_ranks_episodes(tmp_path, tiny_model_dir, reward_model_dir):
    overrides = scorer_run(
        tmp_path,
        tiny_model_dir,
        rollout=2,
        **{"reward.model.path": reward_model_dir, "reward.model.transform": "sigmoid", "reward.model.batch_wait_s": 1},
    )
    result = train(4, overrides, timeout=600)
    assert_ok(result)
    logged = scalars(tmp_path / "run")
    assert [value for _, value in logged["episode/failed"]] == [0.0] * STEPS
    assert [value for _, value in logged["episode/count"]] == [EPISODES] * STEPS
    assert all(value > 0 for _, value in logged["episode/score_wait_s_mean"])  # scored, by the model: not the env
    for _, value in logged["episode/reward_mean"]:  # sigmoids of the head's logits, not the env's whole rewards
        assert 0 < value < 1 and abs(value * EPISODES - round(value * EPISODES)) > 1e-4
    assert len(logged["train/loss"]) == STEPS
    (summary,) = SUMMARY.findall(result.stdout)
    rank, scorer, episodes, requests, cached, batches, per_batch, shared, failed = summary
    print(
        f"scorer rank {rank}: {episodes} episodes, {batches} batches of {per_batch}, {shared} shared, {cached} cached"
    )
    assert rank == "3" and scorer == f"reward.model ({reward_model_dir})"
    assert int(episodes) == STEPS * EPISODES and int(failed) == 0
    assert int(requests) >= 2 * STEPS  # each rollout rank asks at least once a step
    assert 1 <= int(batches) <= STEPS * EPISODES - int(cached)


def test_a_judge_on_a_scorer_rank_gives_the_rewards_the_trainer_trains_on(tmp_path, tiny_model_dir, judge_dir):
    judge = {
        "reward.judge.path": judge_dir,
        "reward.judge.rubric": "'Rate the reply from 0 to 9.\nReply: {completion}'",
        "reward.judge.score_range": "[0, 9]",
        "reward.judge.max_tokens": 8,
    }
    result = train(3, scorer_run(tmp_path, tiny_model_dir, rollout=1, **judge), timeout=600)
    assert_ok(result)
    logged = scalars(tmp_path / "run")
    assert [value for _, value in logged["episode/failed"]] == [0.0] * STEPS
    assert [value for _, value in logged["episode/reward_mean"]] == [pytest.approx(7 / 9)] * STEPS  # the judge's 7
    (summary,) = SUMMARY.findall(result.stdout)
    assert summary[1] == f"reward.judge ({judge_dir})" and int(summary[2]) == STEPS * EPISODES


def test_a_scorer_whose_scores_all_fail_stops_the_run_at_its_first_step(tmp_path, tiny_model_dir, reward_model_dir):
    overrides = scorer_run(tmp_path, tiny_model_dir, rollout=1, **{"reward.model.path": reward_model_dir})
    result = train(3, [*overrides, "reward.model.max_length=8"], timeout=600)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"step 0: {EPISODES} of {EPISODES} episodes failed with the same error" in output
    assert f"reward.model ({reward_model_dir}) on scorer rank 2: an episode's text is" in output


def test_a_scorer_rank_killed_mid_run_ends_the_job(tmp_path, tiny_model_dir, reward_model_dir):
    overrides = scorer_run(tmp_path, tiny_model_dir, rollout=1, **{"reward.model.path": reward_model_dir})
    process = start_training(3, [*overrides, "steps=200"])
    run_dir = tmp_path / "run"
    wait_for(lambda: (run_dir / "tb").exists() and 2 in rank_pids(run_dir), 300, process, "a started run")
    os.kill(rank_pids(run_dir)[2], signal.SIGKILL)
    finish(process, 120, "the job whose scorer rank was killed")
    assert process.returncode != 0
