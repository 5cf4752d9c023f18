"""The liveness bookkeeping (agentrl/run/liveness.py) on a fake clock, without MPI."""

from agentrl.run.liveness import PeerWatch, beat_interval_s, lost_message


def test_a_peer_counts_as_lost_only_after_the_timeout_of_silence():
    watch = PeerWatch([1, 2], timeout_s=30, now=100.0)
    assert watch.silent(129.0) is None
    watch.heard(1, 129.0)
    assert watch.silent(130.5) == (2, 30.5)  # peer 2 silent since the start
    watch.heard(2, 130.5)
    assert watch.silent(159.0) is None
    assert watch.silent(160.0) == (1, 31.0)  # the longest silent one


def test_a_peer_that_said_bye_is_not_watched_any_more():
    watch = PeerWatch([1, 2], timeout_s=5, now=0.0)
    watch.bye(1, 1.0)
    assert not watch.all_finished
    assert watch.silent(100.0) == (2, 100.0)
    watch.bye(2, 100.0)
    assert watch.all_finished and watch.silent(1000.0) is None


def test_beats_come_several_times_per_timeout_and_at_least_every_second():
    assert beat_interval_s(60) == 1.0
    assert beat_interval_s(2) == 0.4


def test_the_message_names_the_silent_node_the_time_and_the_presumed_cause():
    text = lost_message(0, "node0", 2, "node1", 31.04, 30)
    assert "rank 0 on node0" in text and "node1 (its first rank, 2)" in text and "31.0 s" in text
    assert "runtime.peer_timeout_s=30" in text and "link or the node itself is presumed lost" in text
