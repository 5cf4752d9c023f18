"""Asynchronous rollouts in one process: per-token weight versions, new weights reaching episodes in flight,
a stop cancelling them, the trainer's staleness bound and its metrics, the config's checks."""

import time

import numpy as np
import pytest

from agentrl.config import ConfigError, from_dict, load_config
from agentrl.env.client import LocalEnvClient
from agentrl.env.host import EnvHost
from agentrl.roles.rollout_parts import rollout_worker
from agentrl.rollout.agent_loop import Stopped
from agentrl.rollout.worker import RolloutWorker
from agentrl.trainer import staleness
from agentrl.trajectory import Episode, pack, select_episodes
from tests.mpi.helpers import QUICKSTART


def episode(group: int, turns: list[tuple[int, int]], prompt: int = 2) -> Episode:
    """An episode of `prompt` template tokens then, per turn, (n generated tokens at version v) + 1 env token."""
    e = Episode(group=group, task_seed=group)
    e.extend(range(prompt), mask=0)
    for n, version in turns:
        start = len(e.tokens)
        e.extend([7] * n, mask=1, logprobs=[-0.1 * version] * n, version=version)
        e.turn_spans.append((start, len(e.tokens)))
        e.turn_rewards.append(float(version))
        e.turn_states.append(version)
        e.extend([9], mask=0)
    e.reward = float(group)
    e.weight_version = min(v for _, v in turns)
    e.add_metrics({"tool_calls": group})
    return e


def test_select_episodes_equals_packing_only_the_kept_ones():
    episodes = [episode(0, [(2, 5), (3, 6)]), episode(1, [(1, 4)], prompt=4), episode(2, [(2, 6), (1, 6), (2, 6)])]
    selected = select_episodes(pack(episodes), np.array([True, False, True]))
    expected = pack([episodes[0], episodes[2]])
    assert sorted(selected) == sorted(expected)
    for key, values in expected.items():
        np.testing.assert_array_equal(selected[key], values, err_msg=key)


def test_admit_drops_episodes_older_than_the_bound_and_counts_the_lags():
    step = 10
    episodes = [
        episode(0, [(2, 10), (2, 10)]),  # lag 0
        episode(1, [(3, 9), (1, 10)]),  # partial: lag 1 then 0
        episode(2, [(4, 8)]),  # lag 2: stale at K = 1
        Episode(group=3, task_seed=3, finish="error"),  # failed at reset: generated nothing, not stale
    ]
    episodes[3].extend([0], mask=0)
    kept, sums = staleness.admit(pack(episodes), step, max_staleness=1)
    assert list(kept["group"]) == [0, 1, 3]
    assert sums["stale_episodes"] == 1 and sums["partial_episodes"] == 1
    assert sums["tokens"] == 8 and sums["tokens_lag_0"] == 5 and sums["tokens_lag_1"] == 3
    metrics = staleness.metrics(sums, 1)
    assert metrics["async/lag_mean"] == pytest.approx(3 / 8)
    assert metrics["async/lag_max"] == 1 and metrics["async/dropped_stale"] == 1
    assert metrics["async/tokens_lag_0"] == pytest.approx(5 / 8)

    untouched, sums = staleness.admit(pack(episodes), step, max_staleness=2)  # within the bound: the same arrays
    assert sums["stale_episodes"] == 0 and staleness.metrics(sums, 2)["async/lag_max"] == 2
    for key, values in pack(episodes).items():
        np.testing.assert_array_equal(untouched[key], values)


def worker_for(tiny_model_dir, **rollout) -> RolloutWorker:
    config = from_dict(
        {
            "model": {"path": str(tiny_model_dir)},
            "env": {"id": "guess_number"},
            "rollout": {"tasks_per_step": 2, "group_size": 4, "max_new_tokens": 1, "max_turns": 3, **rollout},
        }
    )
    return rollout_worker(config, LocalEnvClient(EnvHost("guess_number", {})), 0, 1)


def test_new_weights_reach_episodes_in_flight_at_their_next_turn(tiny_model_dir):
    worker = worker_for(tiny_model_dir)
    engine = worker.engine
    engine.load_weights(list(engine.model.named_parameters()), 4)
    polls = []

    def between_batches() -> bool:  # as WeightWatcher.poll: a new version once the first turns are done
        polls.append(engine.stats["batches"])
        if engine.stats["batches"] >= 1 and engine.weight_version == 4:
            engine.load_weights(list(engine.model.named_parameters()), 5)
        return True

    worker.between_batches = between_batches
    episodes, _ = worker.collect(step=0)
    assert polls, "nothing polled while the episodes were in flight"
    turn_versions = [[e.token_versions[a] for a, b in e.turn_spans] for e in episodes]
    assert all(versions[0] == 4 for versions in turn_versions)  # the first turn ran on the old weights
    assert any(5 in versions for versions in turn_versions)  # later turns of episodes in flight on the new ones
    assert all(versions == sorted(versions) for versions in turn_versions)
    assert all(e.weight_version == 4 for e in episodes)  # an episode's version is its oldest
    for e in episodes:  # template and env tokens are not generated: version -1
        generated, versions = np.array(e.loss_mask) == 1, np.array(e.token_versions)
        assert (versions[~generated] == -1).all() and (versions[generated] >= 4).all()


@pytest.mark.parametrize("scheduler", ["batch", "continuous"])
def test_a_stop_cancels_the_episodes_in_flight(tiny_model_dir, scheduler):
    worker = worker_for(tiny_model_dir, engine={"scheduler": scheduler})
    worker.between_batches = lambda: worker.engine.stats["batches"] < 1
    with pytest.raises(Stopped):
        worker.collect(step=0)
    worker.between_batches = None  # the worker and its env host still serve the next collect
    episodes, _ = worker.collect(step=1)
    assert len(episodes) == 8 and all(e.turns >= 1 for e in episodes)


def test_the_batch_scheduler_looks_for_weights_between_its_batches_not_on_a_timer(tiny_model_dir):
    worker = worker_for(tiny_model_dir, max_staleness=1)  # running ahead: its steps stay off the loop
    engine = worker.engine
    assert not engine.steps_on_loop
    run_batch = engine._run_batch

    def slow_batch(*args, **kwargs):  # 30 ms a batch: a timer of POLL_WEIGHTS_S would look 15 times during each
        time.sleep(0.03)
        return run_batch(*args, **kwargs)

    engine._run_batch = slow_batch
    looks = []
    worker.between_batches = lambda: looks.append(engine._model_lock.locked()) or True
    worker.weights_at_batches = True  # the trainer's send does not wait for this rank (shm on its node)
    episodes, _ = worker.collect(step=0)
    batches = engine.stats["batches"]
    assert len(episodes) == 8 and batches >= 3
    assert not any(looks), "looked for weights while a batch held the model"
    assert batches <= len(looks) <= 3 * batches + 5  # before each batch, when none is left, and while env replies come

    looks.clear()  # where the trainer's send waits for this rank to receive: still on the timer, batches or not
    worker.weights_at_batches = False
    worker.collect(step=1)
    assert sum(looks) >= engine.stats["batches"] - batches, "no look while batches ran: the trainer would wait"


def test_a_failure_looking_for_weights_before_a_batch_reaches_the_collect(tiny_model_dir):
    worker = worker_for(tiny_model_dir)

    def between_batches() -> bool:
        if worker.engine.stats["batches"] >= 1:
            raise RuntimeError("weights of version 3 arrived where version 2 was announced")
        return True

    worker.between_batches = between_batches
    with pytest.raises(RuntimeError, match="version 3 arrived"):
        worker.collect(step=0)
    worker.between_batches = None  # nothing left stranded: the next collect runs
    episodes, _ = worker.collect(step=1)
    assert len(episodes) == 8 and all(e.turns >= 1 for e in episodes)


def test_async_config_checks():
    # Running ahead, the clipped ratio is taken against the rollout's own log-probs: that weights and bounds.
    config = load_config(QUICKSTART, ["rollout.max_staleness=2"])
    assert config.algorithm.correction.mode == "none"
    assert any("against the rollout's own log-probs" in note for note in config.notes)
    config = load_config(QUICKSTART, ["rollout.max_staleness=2", "algorithm.correction.mode=tis"])
    assert any("no clip bounds an update" in note for note in config.notes)
    tis_more_updates = ["rollout.max_staleness=2", "algorithm.correction.mode=tis", "trainer.updates_per_step=2"]
    assert not any("max_staleness" in note for note in load_config(QUICKSTART, tis_more_updates).notes)
    assert not any("max_staleness" in note for note in load_config(QUICKSTART, []).notes)
    with pytest.raises(ConfigError, match=r"layout\.colocate=true makes them take turns"):
        load_config(QUICKSTART, ["rollout.max_staleness=1", "layout.colocate=true"])
    with pytest.raises(ConfigError, match="max_staleness"):
        load_config(QUICKSTART, ["rollout.max_staleness=-1"])
