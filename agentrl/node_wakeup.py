"""Wake-ups between processes on one node: a datagram that cuts a polled wait short.

MPI carries the data; a doorbell only says "look now". A rank waiting for a message
sleeps in `select` on its doorbell's socket instead of `time.sleep`, for as long as its
polling schedule says, and the sender rings it right after sending. A ring that is lost
or cannot be made (another node, another network namespace, no Unix sockets) costs only
latency: the wait still polls on its schedule, so correctness never depends on a ring.

The socket is a Unix datagram socket in Linux's abstract namespace (no file to clean up),
named after the process and a random token. Its address is (hostname, name); a ring to
an address on another host is not attempted.

A training job's ranks also share one doorbell each (`share`, at the role's start): every
polled wait in the process (`transport.Backoff`) sleeps on it unless given its own, and a rank
rings the ranks that wait on what it just did (`ring_ranks`): a rollout rank the trainer ranks
after shipping a batch, a trainer rank every other rank after publishing weights, and a rank
that joins a polled collective the communicator's other ranks (`ring_members`), which may be
asleep in it. A ring that wakes a wait for something else costs one more poll.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import socket
import sys

Address = tuple[str, str]


class Doorbell:
    def __init__(self):
        self.host = socket.gethostname()
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.setblocking(False)
        name = f"\0agentrl-doorbell-{os.getpid()}-{secrets.token_hex(6)}"
        self.socket.bind(name)
        self.address: Address = (self.host, name)

    @classmethod
    def create(cls) -> Doorbell | None:
        """A doorbell, or None where the platform has no abstract Unix sockets (waits then only poll)."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls()
        except OSError:
            return None

    def wait(self, timeout_s: float) -> bool:
        """Sleep until rung or `timeout_s` passes; True if rung. Rings that came meanwhile are consumed."""
        readable, _, _ = select.select([self.socket], [], [], timeout_s)
        if not readable:
            return False
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                self.socket.recv(64)
        return True

    def ring(self, address: Address | None) -> bool:
        """Wake the waiter at `address`; False if it is elsewhere or cannot be reached (it polls anyway)."""
        if address is None or address[0] != self.host:
            return False
        try:
            self.socket.sendto(b"!", address[1])
        except BlockingIOError:  # its queue is full of unread rings: it is being woken already
            return True
        except OSError:  # gone, or in another network namespace under the same hostname
            return False
        return True

    def close(self) -> None:
        self.socket.close()


_shared: Doorbell | None = None  # this process's, once `share` ran
_addresses: list[Address | None] = []  # every rank's, by rank in the communicator given to `share`
_group = None  # that communicator's MPI group, to find a sub-communicator's ranks in it
_members: dict[int, list[int]] = {}  # communicator handle -> its other ranks, by rank in `_group`


def share(bell: Doorbell | None, addresses: list[Address | None], group=None) -> None:
    """Make `bell` this process's doorbell for polled waits, and `addresses` (by rank) the ones `ring_ranks` rings;
    `group`: the MPI group of the communicator they were gathered on, for `ring_members`."""
    global _shared, _addresses, _group
    _shared, _addresses, _group = bell, list(addresses), group
    _members.clear()


def shared() -> Doorbell | None:
    return _shared


def ring_ranks(ranks=None) -> None:
    """Ring the shared doorbells of `ranks` (None: every other rank) that live on this host; the others poll."""
    if _shared is None:
        return
    for rank in range(len(_addresses)) if ranks is None else ranks:
        if rank < len(_addresses) and _addresses[rank] != _shared.address:
            _shared.ring(_addresses[rank])


def ring_members(comm) -> None:
    """Ring the other ranks of `comm` (a communicator of ranks among those `share` was given) on this host."""
    if _shared is None or _group is None or comm.Get_size() == 1:
        return
    key = comm.py2f()
    if key not in _members:
        from mpi4py import MPI

        mine = comm.Get_rank()
        others = [rank for rank in range(comm.Get_size()) if rank != mine]
        _members[key] = [r for r in MPI.Group.Translate_ranks(comm.Get_group(), others, _group) if r >= 0]
    ring_ranks(_members[key])
