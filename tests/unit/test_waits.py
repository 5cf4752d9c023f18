"""transport.Backoff: the doubling sleeps of idle waits and the proportional ones of env turns."""

import pytest

from agentrl import transport
from agentrl.transport import MAX_SLEEP_S, MIN_SLEEP_S, Backoff, Polling


def test_doubling_sleeps_grow_to_the_cap():
    backoff = Backoff()
    delays = [backoff.next_delay() for _ in range(12)]
    assert delays[0] == MIN_SLEEP_S and delays[1] == 2 * MIN_SLEEP_S
    assert delays[-1] == MAX_SLEEP_S and delays == sorted(delays)


@pytest.mark.parametrize(("waited_s", "expected_s"), [(0.0, 0.5e-3), (0.01, 0.5e-3), (0.2, 2e-3), (3.0, MAX_SLEEP_S)])
def test_proportional_sleeps_are_a_fraction_of_the_time_waited(waited_s, expected_s):
    backoff = Backoff(polling=Polling(fraction=0.01, min_s=0.5e-3))
    backoff.started -= waited_s
    assert backoff.next_delay() == pytest.approx(expected_s, rel=0.05)


def test_proportional_sleeps_do_not_grow_on_their_own():
    backoff = Backoff(polling=transport.ENV_REPLY_POLLING)
    assert {backoff.next_delay() for _ in range(20)} == {transport.ENV_REPLY_POLLING.min_s}


def test_a_proportional_wait_still_times_out():
    backoff = Backoff(timeout_s=1.0, what="env rank 1 to answer", polling=transport.ENV_REQUEST_POLLING)
    backoff.deadline -= 2.0
    with pytest.raises(TimeoutError, match="env rank 1 to answer"):
        backoff.next_delay()


def test_polling_never_sleeps_longer_than_its_cap():
    backoff = Backoff(polling=Polling(fraction=1.0, min_s=0.5, max_s=0.75))
    backoff.started -= 10.0
    assert backoff.next_delay() == 0.75
