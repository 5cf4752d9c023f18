import os
import signal

import pytest

from agentrl.run import preempt


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


def test_a_second_ctrl_c_stops_at_once(handlers):
    preempt.install()
    os.kill(os.getpid(), signal.SIGINT)
    assert preempt.requested() and preempt.reason() == "SIGINT"
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_a_signal_on_another_rank_reaches_the_leader(handlers):
    from mpi4py import MPI

    preempt.install()
    comm = MPI.COMM_SELF  # this process plays both the signalled rank and the trainer leader (rank 0)
    preempt.forward(comm, 0)
    assert preempt.take_forwarded(comm) == []  # nothing to tell before a signal
    os.kill(os.getpid(), signal.SIGTERM)
    preempt.forward(comm, 0)
    preempt.forward(comm, 0)  # once only
    preempt._received.clear()  # the leader's own flag is not set: only the request stops it
    assert not preempt.requested()
    assert preempt.take_forwarded(comm) == ["SIGTERM on rank 0"]
    preempt.finish_forwarding()
    assert preempt.requested() and preempt.agreed(comm) and preempt.reason() == "SIGTERM on rank 0"
