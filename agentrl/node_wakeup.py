"""Wake-ups between processes on one node: a datagram that cuts a polled wait short.

MPI carries the data; a doorbell only says "look now". A rank waiting for a message
sleeps in `select` on its doorbell's socket instead of `time.sleep`, for as long as its
polling schedule says, and the sender rings it right after sending. A ring that is lost
or cannot be made (another node, another network namespace, no Unix sockets) costs only
latency: the wait still polls on its schedule, so correctness never depends on a ring.

The socket is a Unix datagram socket in Linux's abstract namespace (no file to clean up),
named after the process and a random token. Its address is (hostname, name); a ring to
an address on another host is not attempted.
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
