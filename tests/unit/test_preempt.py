import os
import signal

import pytest

from agentrl import preempt


@pytest.fixture
def handlers():
    saved = {signum: signal.getsignal(signum) for signum in preempt.STOP_SIGNALS}
    preempt.reset()
    yield
    preempt.reset()
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", preempt.STOP_SIGNALS)
def test_a_stop_signal_only_sets_the_flag(handlers, signum):
    from mpi4py import MPI

    preempt.install()
    assert not preempt.requested() and not preempt.agreed(MPI.COMM_SELF)
    os.kill(os.getpid(), signum)
    assert preempt.requested() and preempt.agreed(MPI.COMM_SELF)


def test_stopped_message_names_the_step():
    assert "stopped by signal at step 7, checkpoint written" in preempt.stopped_message(7)
