"""Under mpirun: weights through node-local shared memory (weights.transport=shm), on simulated nodes."""

import re

import pytest

from tests.mpi.helpers import TRANSPORT_COMPARISON, assert_ok, scalars, script, small_run, train

pytestmark = pytest.mark.mpi


def test_two_simulated_nodes_of_two_ranks_hold_the_trainers_exact_weights(tiny_model_dir):
    """2 nodes x 2 ranks: one broadcast to node 1's leader, windows on both nodes, lagging readers, three
    versions back to back: every rollout rank holds each version bit for bit, viewing the window (mapped)
    or copying from it; in place, the trainer's own parameters live in node 0's window (lockstep).
    The three ways run in turn in one job (a job's start costs more than its syncs)."""
    modes = ("on", "off", "inplace")
    result = script(4, "weight_sync_shm.py", str(tiny_model_dir), "1,3,0", ",".join(modes), timeout=240)
    assert_ok(result)
    for mapped in modes:
        tag = f"[{mapped}] "
        out = "\n".join(line.removeprefix(tag) for line in result.stdout.splitlines() if line.startswith(tag))
        how = "copies from the window" if mapped == "off" else "views the window"
        assert f"trainer on node 0: 2 node leaders get the broadcast; mapped: {mapped != 'off'}" in out, mapped
        assert f"trainer trains in the window: {mapped == 'inplace'}" in out, mapped
        # only the broadcast's receiver holds the trainer up: a rank running ahead looks for weights promptly there
        assert (
            f"rank 2 on node 1 is a node leader (broadcast into the window); it {how}; the trainer waits for "
            "it: True" in out
        ), mapped
        assert f"rank 1 on node 0 is a window reader; it {how}; the trainer waits for it: False" in out, mapped
        assert f"rank 3 on node 1 is a window reader; it {how}; the trainer waits for it: False" in out, mapped
        assert out.count("holds versions 1, 2 and 3 bit for bit") == 3, mapped


def test_a_rollout_rank_takes_weights_while_the_trainer_computes(tiny_model_dir):
    """After publishing, the trainer leader computes for 4 s without MPI calls; its part of the readers'
    handoff barriers completes in the background, so they hold the version long before that ends."""
    result = script(3, "weight_sync_shm_busy_trainer.py", str(tiny_model_dir), timeout=120)
    assert_ok(result)
    delays = [float(seconds) for seconds in re.findall(r"held version 1 (-?[0-9.]+) s after", result.stdout)]
    assert len(delays) == 2 and max(delays) < 2.0, result.stdout


def test_env_ranks_stay_out_of_the_shared_memory_sync(tiny_model_dir):
    """trainer, rollout | rollout, env: the env rank joins no weight communicator or window."""
    result = script(4, "weight_sync_shm.py", str(tiny_model_dir), "1,2,1", timeout=240)
    assert_ok(result)
    assert "mapped: False" in result.stdout, "auto: one rollout rank per node copies"
    assert "rank 2 on node 1 is a node leader (broadcast into the window)" in result.stdout
    assert result.stdout.count("holds versions 1, 2 and 3 bit for bit") == 2


@pytest.mark.parametrize("transport", ["shm", "shm-mapped"])
def test_fsdp_sharded_trainer_gathers_into_the_window_one_bucket_at_a_time(tmp_path, transport):
    """Copying: bounded extra memory; mapped: the gathers in manifest order land at the mapped layout's offsets."""
    result = script(3, "fsdp_weight_sync.py", str(tmp_path / "model"), "1.0", transport, timeout=120)
    assert_ok(result)
    assert "rollout rank holds the gathered weights" in result.stdout


def test_training_with_shared_memory_weights_matches_the_mpi_sync(
    tmp_path, tiny_model_dir, monkeypatch, mpi_sync_reference
):
    """`agentrl train` with weights.transport=shm on 2 simulated nodes (trainer + rollout | rollout),
    engines copying from the window or viewing it (shm_mapped=true), the trainer training in the window
    itself or copying each version into it, trains exactly like the MPI broadcast."""
    syncs = {
        "shm": {"weights.transport": "shm"},
        "shm mapped": {"weights.transport": "shm", "weights.shm_mapped": True, "weights.shm_in_place": False},
        "shm in place": {"weights.transport": "shm", "weights.shm_mapped": True, "weights.shm_in_place": True},
    }
    runs = {"mpi": mpi_sync_reference}  # one node; the MPI broadcast does not depend on the nodes
    monkeypatch.setenv("AGENTRL_RANKS_PER_NODE", "2")
    for sync, overrides in syncs.items():
        run = tmp_path / sync.replace(" ", "_")
        result = train(3, small_run(run, tiny_model_dir, **TRANSPORT_COMPARISON, **overrides))
        assert_ok(result)
        if sync == "shm":  # the printed placement: rank 2 leads node 1 and gets the broadcast
            assert "bcast+shm" in result.stdout and result.stdout.count(" shm\n") == 1, result.stdout
        trains_in_window = "parameters live in its node's shared-memory window" in result.stdout
        assert trains_in_window == (sync == "shm in place"), (sync, result.stdout)
        runs[sync] = scalars(run / "run")
    for sync in ("shm", "shm mapped", "shm in place"):
        assert all(v < 1e-4 for _, v in runs[sync]["train/logprob_diff_vs_rollout"])
        assert all(v == 0 for _, v in runs[sync]["episode/weight_lag_mean"])
        # same seeds, same weights: the same episodes, and the same loss up to float rounding (a GRPO loss at the
        # first step sums advantages that cancel: about 1e-9, whose last bits move with the trainer's thread count)
        assert runs[sync]["episode/reward_mean"] == runs["mpi"]["episode/reward_mean"], sync
        losses, reference = runs[sync]["train/loss"], runs["mpi"]["train/loss"]
        assert [s for s, _ in losses] == [s for s, _ in reference], sync
        assert all(abs(a - b) < 1e-6 for (_, a), (_, b) in zip(losses, reference, strict=True)), (sync, losses)
