"""Every MPI call agentrl makes: tags, polling waits, pickled messages, array broadcasts.

Blocking MPI receives busy-spin a core, which on an oversubscribed node steals CPU from
the ranks doing work. Every wait here polls a non-blocking call and sleeps between
polls, so an idle rank costs almost nothing. By default the sleeps double from
MIN_SLEEP_S to MAX_SLEEP_S; a wait on a hot path (an env turn) passes a `Polling`
instead, so each sleep is a fraction of the time waited so far (within bounds): a
message that comes soon is seen soon, one that comes late costs at most that fraction of
the wait in extra latency, and a long wait still settles at MAX_SLEEP_S.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from agentrl import node_wakeup
from agentrl.errors import EXIT_USER_ERROR, RefusedOnEveryRank, UserError
from agentrl.node_wakeup import Doorbell

MIN_SLEEP_S = 50e-6
MAX_SLEEP_S = 5e-3
ABORT_GRACE_S = 1.0
# Launcher variables a child process must not see, or it would join (or hang on) this MPI job.
MPI_VARIABLE_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_", "I_MPI_")
# Where launchers put a process's world rank before MPI is initialized (MPICH and Intel MPI, Open MPI, PMIx, srun).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program stopped by Ctrl-C


class Tag(IntEnum):
    ENV_REQUEST = 11
    ENV_REPLY = 12
    SCORE_REQUEST = 13  # a rollout rank's finished episodes, to its scorer rank (or its goodbye)
    SCORE_REPLY = 14  # a scorer rank's scores (or its last word to a rollout rank that said goodbye)
    TRAJECTORIES = 21
    EVAL = 22  # a rollout rank's evaluation results, to the trainer leader
    WEIGHTS = 23  # the trainer leader announces a weight version (or a stop) to rollout ranks running ahead
    TASKS = 24  # rollout.dispatch=dynamic: a rollout rank claims tasks from rollout rank 0
    TASK_REPLY = 25
    STOP_REQUEST = 31  # a rank that got a stop signal tells the trainer leader
    SERVE_REQUEST = 41  # agentrl serve: rank 0 hands a generation (or the stop) to an engine rank
    SERVE_REPLY = 42  # an engine rank's result, its stop request or its last word


@dataclass(frozen=True)
class Polling:
    """Sleep `fraction` of the time waited so far between polls, never less than `min_s` nor more than `max_s`."""

    fraction: float
    min_s: float = MIN_SLEEP_S
    max_s: float = MAX_SLEEP_S


# An env rank's reply: due within a millisecond, so polled often at first (see docs/performance.md).
ENV_REPLY_POLLING = Polling(fraction=0.01, min_s=MIN_SLEEP_S)
# The next turn's request: one generation away, at least milliseconds, so the first polls need not be as close.
ENV_REQUEST_POLLING = Polling(fraction=0.01, min_s=0.5e-3)
# Episodes to score, and their scores: a batch's wait and a forward away, so polled as an env rank's requests are.
SCORE_POLLING = Polling(fraction=0.01, min_s=0.5e-3)


# A rank's share of a collective left pending while it computes: the others wait on it, so polled every
# millisecond at first; a collective still pending after half a second waits for a rank that is busy.
BACKGROUND_PROGRESS_POLLING = Polling(fraction=0.01, min_s=1e-3)


class Backoff:
    """Sleeps that grow from MIN_SLEEP_S to `max_sleep_s` while nothing happens.

    Without `polling` each sleep doubles the last; with it, each sleep is a fraction of the
    time waited so far.
    """

    def __init__(
        self,
        timeout_s: float | None = None,
        what: str = "a message",
        max_sleep_s: float = MAX_SLEEP_S,
        polling: Polling | None = None,
        doorbell: Doorbell | None = None,
    ):
        self.delay = MIN_SLEEP_S
        self.doorbell = doorbell or node_wakeup.shared()
        self.max_sleep_s = max_sleep_s
        self.started = time.monotonic()
        self.deadline = None if timeout_s is None else self.started + timeout_s
        self.what = what
        self.polling = polling

    def next_delay(self) -> float:
        now = time.monotonic()
        if self.deadline is not None and now > self.deadline:
            raise TimeoutError(f"timed out waiting for {self.what}")
        if self.polling is not None:
            return min(max(self.polling.fraction * (now - self.started), self.polling.min_s), self.polling.max_s)
        delay = self.delay
        self.delay = min(self.delay * 2, self.max_sleep_s)
        return delay

    def sleep(self) -> None:
        """Sleep the next delay; with a doorbell, until it is rung if that comes sooner. A ring starts the sleeps
        over from the shortest: what it announced may take a few more looks (a collective's rounds)."""
        if self.doorbell is None:
            time.sleep(self.next_delay())
        elif self.doorbell.wait(self.next_delay()):
            self.delay, self.started = MIN_SLEEP_S, time.monotonic()


class BackgroundProgress:
    """Completes non-blocking MPI requests on a thread while this rank computes.

    MPI moves a non-blocking collective along only inside MPI calls. A rank that leaves one
    pending and goes to compute holds up the other ranks of it until its next MPI call: a
    barrier's later rounds wait for messages this rank sends only once it has seen the
    earlier ones. The thread tests the requests, sleeping between tests (BACKGROUND_PROGRESS_POLLING), until
    they complete or `finish()` is called; after `finish()` the caller may wait for them
    itself. Without MPI_THREAD_MULTIPLE no thread is started (the requests progress at the
    caller's next MPI call, as before).
    """

    def __init__(self, requests: list):
        from mpi4py import MPI

        self.requests = list(requests)
        self.stopping = threading.Event()
        self.thread = None
        if self.requests and MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
            self.thread = threading.Thread(target=self._run, name="mpi-progress", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        from mpi4py import MPI

        backoff = Backoff(polling=BACKGROUND_PROGRESS_POLLING)
        while not self.stopping.is_set():
            if MPI.Request.Testall(self.requests):
                return
            self.stopping.wait(backoff.next_delay())

    def finish(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()


def wait_until(
    ready: Callable[[], object],
    timeout_s: float | None = None,
    what: str = "a message",
    max_sleep_s: float = MAX_SLEEP_S,
):
    """Poll `ready()` until it returns something truthy; return that (sleeps between polls grow to max_sleep_s)."""
    backoff = Backoff(timeout_s, what, max_sleep_s)
    while not (result := ready()):
        backoff.sleep()
    return result


def wait(
    request, timeout_s: float | None = None, what: str = "an MPI request", max_sleep_s: float = MAX_SLEEP_S
) -> None:
    """Complete a non-blocking MPI request without spinning."""
    wait_until(request.Test, timeout_s, what, max_sleep_s)


def wait_collective(comm, request, what: str, max_sleep_s: float = MAX_SLEEP_S) -> None:
    """Complete a non-blocking collective of `comm`, polled: one test (this rank's part on its way), a ring to the
    other ranks (one that came first sleeps in its own wait and would look only at its next poll; rung, it polls
    from the shortest sleep again), then the wait."""
    done = request.Test()
    node_wakeup.ring_members(comm)
    if not done:
        wait(request, what=what, max_sleep_s=max_sleep_s)


def pickled(comm):
    """The pkl5 wrapper of `comm`: out-of-band pickle-5 buffers, so numpy arrays travel as raw memory."""
    from mpi4py.util import pkl5

    return pkl5.Intracomm(comm)


def send(comm, obj, dest: int, tag: Tag) -> None:
    """Send a Python object (numpy arrays inside travel zero-copy) and wait without spinning."""
    wait_sent(isend(comm, obj, dest, tag), f"send to rank {dest} (tag {tag.name})")


def isend(comm, obj, dest: int, tag: Tag):
    """Start sending a Python object; the request (keep it: it holds the buffers) completes once MPI is done."""
    return pickled(comm).isend(obj, dest=dest, tag=int(tag))


def wait_sent(request, what: str = "a send") -> None:
    wait_until(lambda: request.test()[0], what=what)  # test() -> (flag, obj)


def wait_for_message(comm, source: int, tag: Tag, timeout_s: float | None = None) -> None:
    """Return once a message from `source` with `tag` can be received, without receiving it."""
    wait_until(lambda: probe(comm, source, tag), timeout_s, f"a {tag.name} message")


def probe(comm, source: int, tag: Tag) -> bool:
    """Whether a message from `source` with `tag` is waiting. Asked twice: MPICH over UCX pulls a
    newly arrived message in on one probe and reports it only on the next, so a single probe
    per poll would see every message one sleep late."""
    return bool(comm.Iprobe(source=source, tag=int(tag)) or comm.Iprobe(source=source, tag=int(tag)))


def try_recv(comm, source: int, tag: Tag):
    """(found, obj, source): a waiting message, or (False, None, None)."""
    from mpi4py import MPI

    if not probe(comm, source, tag):  # a tenth of improbe's cost on pkl5, and most polls find nothing
        return False, None, None
    status = MPI.Status()
    message = pickled(comm).improbe(source=source, tag=int(tag), status=status)
    if message is None:
        return False, None, None
    return True, message.recv(), status.Get_source()


def recv(
    comm,
    source: int,
    tag: Tag,
    timeout_s: float | None = None,
    polling: Polling | None = None,
    doorbell: Doorbell | None = None,
):
    """(obj, source) of the next message from `source` (MPI.ANY_SOURCE allowed), polling (see Backoff).

    With a `doorbell`, a sender that rings it after sending is seen at once rather than at the next poll.
    """
    backoff = Backoff(timeout_s, f"a {tag.name} message", polling=polling, doorbell=doorbell)
    while True:
        found, obj, sender = try_recv(comm, source, tag)
        if found:
            return obj, sender
        backoff.sleep()


def exchange(comm, outgoing: list, tag: Tag) -> list:
    """Every rank sends `outgoing[r]` to rank r of `comm` (its own kept, not sent) and gets what each rank sent it,
    in rank order: an all-to-all of Python objects, numpy arrays inside travelling as raw memory."""
    me = comm.Get_rank()
    sends = [isend(comm, item, rank, tag) for rank, item in enumerate(outgoing) if rank != me]
    node_wakeup.ring_members(comm)
    incoming = [outgoing[me] if rank == me else recv(comm, rank, tag)[0] for rank in range(comm.Get_size())]
    for request in sends:
        wait_sent(request, f"a {tag.name} message")
    return incoming


def all_here(comm, what: str, max_sleep_s: float = MAX_SLEEP_S) -> None:
    """Return once every rank of `comm` has come here: a polled non-blocking barrier, rung.

    The data collectives below wait for the other ranks here, then move the data with MPI's blocking call, which
    spins only while the data moves. A non-blocking collective polled from the start advances only when a rank
    looks, so one of several rounds (an allreduce of a gradient) took a sleep of each side's backoff: 1.75 ms
    for 130k floats on two ranks where arriving, then the blocking call, takes 0.33.
    """
    if comm.Get_size() > 1:
        wait_collective(comm, comm.Ibarrier(), what, max_sleep_s)


def bcast_array(comm, array: np.ndarray, root: int = 0, max_sleep_s: float = MAX_SLEEP_S) -> None:
    """Broadcast a contiguous numpy array in place: every rank waits polled (`all_here`), then the broadcast."""
    all_here(comm, "a broadcast", max_sleep_s)
    comm.Bcast(array, root=root)


def bcast_object(comm, obj, root: int = 0, max_sleep_s: float = MAX_SLEEP_S):
    """Broadcast a small picklable object; non-roots pass None and get the root's object."""
    import pickle

    is_root = comm.Get_rank() == root
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if is_root else None
    size = np.array([payload.size if is_root else 0], dtype=np.int64)
    bcast_array(comm, size, root, max_sleep_s)
    buffer = payload.copy() if is_root else np.empty(int(size[0]), dtype=np.uint8)
    bcast_array(comm, buffer, root, max_sleep_s)
    return obj if is_root else pickle.loads(buffer.tobytes())


def rendezvous_address(comm, root: int = 0) -> tuple[str, int]:
    """(host, free port) of the root rank, for a torch.distributed group's TCP rendezvous, known to every rank.

    The host is $AGENTRL_MASTER_ADDR if set, else what the root's hostname resolves to.
    """
    address = None
    if comm.Get_rank() == root:
        hostname = socket.gethostname()
        try:
            host = os.environ.get("AGENTRL_MASTER_ADDR") or socket.gethostbyname(hostname)
        except OSError as error:
            raise RuntimeError(
                f"cannot resolve this node's hostname {hostname!r} for a torch.distributed rendezvous ({error}); "
                "fix /etc/hosts or DNS, or set AGENTRL_MASTER_ADDR to an address the other nodes can reach"
            ) from error
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            address = (host, probe.getsockname()[1])
    return bcast_object(comm, address, root=root)


def allocate_shared(node_comm, nbytes: int):
    """(window, its memory as a uint8 array on every rank): `nbytes` of node-local shared memory owned by rank 0.

    Collective over `node_comm`, whose ranks must share memory (one node). The window is
    left in a passive-target epoch (`Lock_all`), which `Win.Sync` (the memory barrier
    between processes' views) needs.
    """
    from mpi4py import MPI

    window = MPI.Win.Allocate_shared(nbytes if node_comm.Get_rank() == 0 else 0, 1, comm=node_comm)
    buffer, _ = window.Shared_query(0)
    memory = np.ndarray(buffer=buffer, dtype=np.uint8, shape=(nbytes,))
    window.Lock_all(MPI.MODE_NOCHECK)
    return window, memory


def free_shared(window) -> None:
    """Collective over the window's communicator; no array viewing its memory may be used afterwards."""
    window.Unlock_all()
    window.Free()


def barrier(comm) -> None:
    wait_collective(comm, comm.Ibarrier(), "a barrier")


def allreduce_sum(comm, array: np.ndarray, max_sleep_s: float = MAX_SLEEP_S) -> np.ndarray:
    from mpi4py import MPI

    out = np.empty_like(array)
    all_here(comm, "an allreduce", max_sleep_s)
    comm.Allreduce(array, out, op=MPI.SUM)
    return out


def allgather_object(comm, obj) -> list:
    """Every rank's small picklable object, in rank order, on every rank."""
    import pickle

    if comm.Get_size() == 1:
        return [obj]

    from mpi4py import MPI

    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = np.empty(comm.Get_size(), dtype=np.int64)
    all_here(comm, "an allgather")
    comm.Allgather(np.array([payload.size], dtype=np.int64), sizes)
    displacements = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    gathered = np.empty(int(sizes.sum()), dtype=np.uint8)
    comm.Allgatherv(payload, [gathered, sizes, displacements, MPI.BYTE])
    return [pickle.loads(gathered[d : d + n].tobytes()) for d, n in zip(displacements, sizes, strict=True)]


def allreduce_named(comm, values: dict[str, float]) -> dict[str, float]:
    """Sum named numbers over the ranks of `comm`; a name some rank lacks counts as 0 there. One allgather, summed
    in rank order on every rank: the same totals everywhere."""
    gathered = allgather_object(comm, values)
    names = sorted(set().union(*gathered))
    return {name: float(sum(rank_values.get(name, 0.0) for rank_values in gathered)) for name in names}


def agree_on_root(comm, work: Callable[[], object], root: int = 0):
    """`work()` on the root only; its result on every rank, or its UserError raised on every rank.

    For checks only one rank can make (files, locks): the other ranks wait for the verdict
    instead of being aborted, so a user error is one message and every rank exits alike.
    """
    outcome = None
    if comm.Get_rank() == root:
        try:
            outcome = ("done", work())
        except UserError as error:
            outcome = ("refused", str(error))
    kind, value = bcast_object(comm, outcome, root=root)
    if kind == "refused":
        raise RefusedOnEveryRank(value)
    return value


def abort_on_exception(main: Callable[[], int | None]) -> Callable[[], int | None]:
    """Wrap an entry point: an uncaught exception on any rank ends every rank of the job.

    A bug prints its traceback; a UserError prints its message only; a KeyboardInterrupt
    (a second Ctrl-C) prints one line from rank 0. RefusedOnEveryRank passes through without
    an abort, since every rank raises it.
    """

    def wrapped():
        try:
            return main()
        except (SystemExit, RefusedOnEveryRank):
            raise
        except KeyboardInterrupt:
            if world_rank() == 0:
                sys.stderr.write(
                    "agentrl: interrupted again: stopped at once, without a checkpoint; "
                    "resume=true continues from the last checkpoint\n"
                )
            abort_world(EXIT_INTERRUPTED, grace_s=0.0)
            # Now, not at interpreter exit: the interrupted asyncio tasks and generators would
            # print their half-finished state ("Task exception was never retrieved") on the way out.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        except UserError as error:
            sys.stdout.flush()
            sys.stderr.write(f"agentrl (rank {world_rank()}): {error}\n")
            abort_world(EXIT_USER_ERROR)
            raise
        except BaseException as error:
            rank = world_rank()
            sys.stdout.flush()
            sys.stderr.write(f"[agentrl rank {rank}] uncaught exception, aborting the job: {error!r:.2000}\n")
            traceback.print_exc()
            abort_world(1)
            raise

    return wrapped


class Failed(Exception):
    """`run_entry_point` found `main` ended in an error (already printed); `exit_code` is the process's."""

    def __init__(self, exit_code: int):
        super().__init__(exit_code)
        self.exit_code = exit_code


def run_entry_point(main: Callable[[], object]) -> object:
    """`main()` under `abort_on_exception`; its result, or Failed with the exit code of how it failed:
    EXIT_USER_ERROR for a UserError, EXIT_INTERRUPTED for a second Ctrl-C, 1 for a bug.
    RefusedOnEveryRank passes through (every rank raises it; the caller prints it once)."""
    try:
        return abort_on_exception(main)()
    except RefusedOnEveryRank:
        raise
    except UserError:
        raise Failed(EXIT_USER_ERROR) from None
    except KeyboardInterrupt:
        raise Failed(EXIT_INTERRUPTED) from None
    except Exception:
        raise Failed(1) from None


def world_rank() -> int:
    """This process's rank in MPI_COMM_WORLD; before MPI is initialized, what the launcher says (0 without one).

    Never initializes MPI itself (importing mpi4py.MPI would).
    """
    MPI = _mpi_if_running()
    if MPI is not None:
        return MPI.COMM_WORLD.Get_rank()
    return next((int(os.environ[name]) for name in RANK_VARIABLES if os.environ.get(name, "").isdigit()), 0)


def finalize() -> None:
    """End MPI on this rank now, where a failure can still be told; a no-op where MPI is not running.

    Left to mpi4py's exit hook, a failing MPI_Finalize (MPICH refuses one while a message to this
    rank was never received) is dropped in silence, and mpirun kills every other rank (exit 9).
    """
    MPI = _mpi_if_running()
    if MPI is None:
        return
    rank = MPI.COMM_WORLD.Get_rank()
    try:
        MPI.Finalize()
    except MPI.Exception as error:
        sys.stderr.write(
            f"agentrl (rank {rank}): MPI_Finalize failed, so mpirun ends the other ranks: {error}\n"
            "This is a bug in agentrl (a message sent to this rank was never received); please report it.\n"
        )
        sys.stderr.flush()
        raise SystemExit(1) from None


def _mpi_if_running():
    MPI = sys.modules.get("mpi4py.MPI")
    return MPI if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized() else None


def abort_world(code: int, grace_s: float = ABORT_GRACE_S) -> None:
    """End every rank of the job with exit code `code` (after `grace_s`, for the launcher to forward this rank's
    output); returns at once where MPI is not running or this rank is alone."""
    MPI = _mpi_if_running()
    sys.stderr.flush()
    if MPI is not None and MPI.COMM_WORLD.Get_size() > 1:
        time.sleep(grace_s)  # let the launcher forward this rank's output before the kill
        MPI.COMM_WORLD.Abort(code)
