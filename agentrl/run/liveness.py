"""Peer liveness across nodes: a job whose node went silent ends within runtime.peer_timeout_s.

A killed process is noticed by the launcher at once (its connection closes), but a cut link
or a node that froze closes nothing: TCP retransmits for many minutes, and every rank would
wait for messages that never come. So each node's first rank (its leader) runs a thread
that sends every other node's leader a one-byte beat every `interval_s` and takes theirs.
A leader that has heard nothing from a node for `timeout_s` prints which node, since when,
and that its link or the node itself is presumed lost, aborts the job and ends its
node's other ranks (on a node that was cut off, the launcher cannot do it).

The thread, not the polled waits, keeps the watch: a rank stuck anywhere (a torch.distributed
all-reduce, a blocking MPI call, a transport wait) is covered alike, and the hot paths (an
env turn's polls) pay nothing. Long phases on a rank (a model load, a checkpoint, a weight
broadcast, a train step) do not stop its beats: the thread needs only the GIL now and then,
which Python hands over every few milliseconds and torch, numpy and mpi4py release in their
long calls. On one node there is nobody to watch and no thread is started.

At the end (`stop`) each leader sends a last message (bye) and waits for every other
leader's: MPI then holds no beat that was never received, which MPI_Finalize would refuse.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from agentrl.transport import ABORT_GRACE_S

BEAT_TAG = 51
BYE_TAG = 52
EXIT_PEER_LOST = 1  # a failure like any other: agentrl supervise restarts it with resume=true
MAX_INTERVAL_S = 1.0


def beat_interval_s(timeout_s: float) -> float:
    """Seconds between beats: a fifth of the timeout (several beats may be late before one counts), at most 1 s."""
    return min(MAX_INTERVAL_S, timeout_s / 5)


class PeerWatch:
    """When each peer was last heard from; which one has been silent too long. No MPI, no clock of its own."""

    def __init__(self, peers: list[int], timeout_s: float, now: float):
        self.timeout_s = timeout_s
        self.last_heard = dict.fromkeys(peers, now)
        self.finished: set[int] = set()  # peers that said bye: silent from now on, rightly

    def heard(self, peer: int, now: float) -> None:
        self.last_heard[peer] = now

    def bye(self, peer: int, now: float) -> None:
        self.heard(peer, now)
        self.finished.add(peer)

    @property
    def all_finished(self) -> bool:
        return self.finished >= set(self.last_heard)

    def silent(self, now: float) -> tuple[int, float] | None:
        """(peer, seconds) of the peer silent longest, if that is over the timeout; else None."""
        waiting = [(now - at, peer) for peer, at in self.last_heard.items() if peer not in self.finished]
        if not waiting:
            return None
        seconds, peer = max(waiting)
        return (peer, seconds) if seconds > self.timeout_s else None


def lost_message(rank: int, here: str, peer_rank: int, peer_node: str, seconds: float, timeout_s: float) -> str:
    return (
        f"agentrl (rank {rank} on {here}): nothing heard from {peer_node} (its first rank, {peer_rank}) for "
        f"{seconds:.1f} s (runtime.peer_timeout_s={timeout_s:g}): its link or the node itself is presumed lost; "
        "aborting the job (agentrl supervise, or resume=true, continues from the last checkpoint)"
    )


class Heartbeat:
    """The beat thread of one node leader over `comm`, the communicator of the node leaders (one per node).

    `names[r]`: what to call the node of leader r in messages; `on_lost(message)`: what to do
    when a node went silent (default: `abort_job`); `clock`: time.monotonic, or a fake in tests.
    """

    def __init__(
        self,
        comm,
        timeout_s: float,
        names: list[str],
        world_ranks: list[int],
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.timeout_s = timeout_s
        self.interval_s = beat_interval_s(timeout_s)
        self.names = names
        self.world_ranks = world_ranks
        self.on_lost = on_lost or abort_job
        self.clock = clock
        self.peers = [r for r in range(comm.Get_size()) if r != self.rank]
        self.watch = PeerWatch(self.peers, timeout_s, clock())
        self.stopping = threading.Event()
        self.sends: list = []
        self.beat = np.zeros(1, dtype=np.uint8)  # kept alive while its sends are in flight
        self.inbox = np.zeros(1, dtype=np.uint8)
        self.lost: str | None = None
        self.thread = threading.Thread(target=self._run, name="agentrl-heartbeat", daemon=True)
        self.thread.start()

    def _send(self, tag: int) -> None:
        from mpi4py import MPI

        self.sends = [request for request in self.sends if not request.Test()]
        self.sends += [self.comm.Isend([self.beat, MPI.BYTE], dest=peer, tag=tag) for peer in self.peers]

    def _take(self) -> None:
        """Receive every beat and bye waiting."""
        from mpi4py import MPI

        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            source, tag = status.Get_source(), status.Get_tag()
            self.comm.Recv([self.inbox, MPI.BYTE], source=source, tag=tag)
            if tag == BYE_TAG:
                self.watch.bye(source, self.clock())
            else:
                self.watch.heard(source, self.clock())

    def _run(self) -> None:
        from mpi4py import MPI

        next_beat = self.clock()
        said_bye = False
        while True:
            now = self.clock()
            if self.stopping.is_set() and not said_bye:
                self._send(BYE_TAG)  # after every beat this rank sent: the peer's bye-wait drains them all
                said_bye = True
            elif not said_bye and now >= next_beat:
                self._send(BEAT_TAG)
                next_beat = now + self.interval_s
            self._take()
            if said_bye and self.watch.all_finished and MPI.Request.Testall(self.sends):
                return
            lost = self.watch.silent(self.clock())
            if lost is not None:
                peer, seconds = lost
                here = self.names[self.rank]
                self.lost = lost_message(
                    self.world_ranks[self.rank], here, self.world_ranks[peer], self.names[peer], seconds, self.timeout_s
                )
                self.on_lost(self.lost)
                return
            if said_bye:
                time.sleep(min(self.interval_s, 0.05))  # `stopping` is set: waiting on it would not sleep
            else:
                self.stopping.wait(self.interval_s / 4)

    def stop(self) -> None:
        """Say bye to the other leaders and wait for theirs (every leader calls this at the job's end)."""
        self.stopping.set()
        self.thread.join()


class Liveness:
    """This rank's part: a Heartbeat on node leaders of a multi-node job, nothing elsewhere.

    Collective over `world` when the job spans nodes (every rank must construct it at the same
    point); `nodes[r]`: rank r's node id, the same list on every rank; `hosts`: each rank's host
    name, or None (simulated nodes).
    """

    def __init__(self, world, nodes: list[int], hosts: list[str] | None, timeout_s: float | None, **heartbeat_options):
        from mpi4py import MPI

        self.heartbeat: Heartbeat | None = None
        self.comm = None
        if timeout_s is None or len(set(nodes)) < 2:
            return
        from agentrl.transport import allgather_object

        rank = world.Get_rank()
        pids = allgather_object(world, os.getpid())
        leaders = [r for r in range(len(nodes)) if nodes.index(nodes[r]) == r]  # each node's first rank
        is_leader = rank in leaders
        self.comm = world.Split(color=0 if is_leader else MPI.UNDEFINED, key=rank)
        if not is_leader:
            self.comm = None
            return
        names = [hosts[r] if hosts is not None else f"node {nodes[r]}" for r in leaders]
        mates = [pids[r] for r in range(len(nodes)) if nodes[r] == nodes[rank] and r != rank]
        heartbeat_options.setdefault("on_lost", lambda message: abort_job(message, mates))
        self.heartbeat = Heartbeat(self.comm, timeout_s, names, leaders, **heartbeat_options)

    def stop(self) -> None:
        """At the job's normal end, on every rank (a no-op on ranks that are not node leaders)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        if self.comm is not None:
            self.comm.Free()
            self.comm = None


def abort_job(message: str, node_mates: list[int] = ()) -> None:
    """Print why, abort the job, end this node's other ranks (`node_mates`: their pids) and this process.

    MPI_Abort called from this thread returns (MPICH 5) and, on the side that was cut off, its
    launcher's helper cannot reach mpiexec to have the node's ranks killed: so this rank ends them.
    """
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)  # the launcher forwards this rank's output before the abort, or it may drop it
    try:
        MPI.COMM_WORLD.Abort(EXIT_PEER_LOST)
    finally:
        for pid in node_mates:
            with contextlib.suppress(OSError):  # ended already
                os.kill(pid, signal.SIGKILL)
        os._exit(EXIT_PEER_LOST)
