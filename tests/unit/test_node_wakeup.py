"""agentrl.node_wakeup: a ring wakes a wait at once, and a ring that cannot be made fails quietly."""

import threading
import time

import pytest

from agentrl import transport
from agentrl.node_wakeup import Doorbell

pytestmark = pytest.mark.skipif(Doorbell.create() is None, reason="no abstract Unix sockets on this platform")


def test_a_ring_ends_a_long_wait_at_once():
    waiter, ringer = Doorbell(), Doorbell()
    threading.Timer(0.2, ringer.ring, args=(waiter.address,)).start()
    started = time.monotonic()
    assert waiter.wait(30.0)
    assert 0.15 < time.monotonic() - started < 5.0


def test_rings_made_before_the_wait_are_kept_and_consumed_together():
    waiter, ringer = Doorbell(), Doorbell()
    assert all(ringer.ring(waiter.address) for _ in range(5))
    assert waiter.wait(1.0)
    assert not waiter.wait(0.05)  # all five were read by the first wake


def test_a_ring_to_another_host_or_a_closed_doorbell_is_not_made():
    waiter, ringer = Doorbell(), Doorbell()
    assert not ringer.ring(("some-other-host", waiter.address[1]))
    assert not ringer.ring(None)
    waiter.close()
    assert not ringer.ring(waiter.address)


def test_a_backoff_with_a_doorbell_sleeps_until_rung():
    waiter, ringer = Doorbell(), Doorbell()
    backoff = transport.Backoff(polling=transport.Polling(fraction=0.0, min_s=30.0, max_s=30.0), doorbell=waiter)
    threading.Timer(0.1, ringer.ring, args=(waiter.address,)).start()
    started = time.monotonic()
    backoff.sleep()
    assert time.monotonic() - started < 5.0


def test_a_polled_wait_sleeps_on_the_shared_doorbell_and_ring_ranks_wakes_it():
    from agentrl import node_wakeup

    waiter, ringer = Doorbell(), Doorbell()
    try:
        node_wakeup.share(waiter, [waiter.address, ringer.address])
        long_sleeps = transport.Polling(fraction=1.0, min_s=30.0, max_s=30.0)
        found = []
        backoff = transport.Backoff(polling=long_sleeps)  # no doorbell given: the shared one
        threading.Timer(0.2, lambda: (found.append(True), ringer.ring(waiter.address))).start()
        started = time.monotonic()
        while not found:
            backoff.sleep()
        assert time.monotonic() - started < 5.0
        # ring_ranks rings the others, never itself (a ring to its own bell would wake its next wait for nothing)
        node_wakeup.ring_ranks()
        assert not waiter.wait(0.05)
        node_wakeup.share(ringer, [waiter.address, ringer.address])
        node_wakeup.ring_ranks([0, 1, 7])  # rank 7: not in the job; nothing to ring
        assert waiter.wait(1.0)
    finally:
        node_wakeup.share(None, [])
