"""The preloaded parent of the mpirun tests' ranks: `python -m tests.mpi.forkserver SOCKET`.

A model rank spends about 7 s of CPU importing torch, transformers and agentrl before its first line of work, and
the suite starts a few hundred of them on 2 cores. This process imports all of that once, then forks a rank for
each `tests/mpi/forked_rank.py` that connects (one per rank that mpirun starts). The fork takes over the client's
descriptors (stdio and MPICH's PMI_FD), working folder, environment and arguments, and runs them as `python ARGS`
would: `-m MODULE ...` or `SCRIPT ...`. MPI is initialized in the fork, never here.

It reports each fork's wait status to its client, and kills a fork whose client went away (mpirun killed it).
SOCKET.forks/CLIENT_PID holds the pid of the client's fork while it runs, for tests that signal a rank they found
by its command line (tests/mpi/helpers.processes_with). The forks die with this process; this process dies with
the pytest worker that started it.

`AGENTRL_TEST_FORKSERVER=0 bash launch/test.sh` starts every rank cold instead (the `forkserver` fixture in
tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import json
import os
import pkgutil
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path

from tests.mpi.forked_rank import receive_exactly

PR_SET_PDEATHSIG = 1
HIGH_DESCRIPTORS = 512  # received descriptors wait here while the fork lays out 0, 1, 2 and PMI_FD
NOT_PRELOADED = ("agentrl.cli", "agentrl.__main__")  # run as __main__ by `-m`, so they must be imported fresh


def die_with_parent(number: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, number)


def preload() -> None:
    """Import what a model rank imports, leaving MPI uninitialized and no thread running (forks copy one thread)."""
    from agentrl.run import startup_gc

    startup_gc.defer_collection()
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import agentrl
    from agentrl.models.loading import import_model_code

    import_model_code()
    for module in pkgutil.walk_packages(agentrl.__path__, "agentrl."):
        if module.name not in NOT_PRELOADED:
            importlib.import_module(module.name)
    if "mpi4py.MPI" in sys.modules:
        raise RuntimeError("preloading initialized MPI; a fork could not start its own MPI")
    if threading.active_count() != 1:
        raise RuntimeError(f"preloading started threads ({threading.enumerate()}); forks would copy them half-alive")
    startup_gc.settle()


@dataclass
class Fork:
    connection: socket.socket | None  # to its client, until either ends
    record: Path  # SOCKET.forks/CLIENT_PID, holding the fork's pid


class ForkServer:
    def __init__(self, path: str):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path + ".binding")
        self.listener.listen(128)
        self.forks_folder = Path(path + ".forks")  # forks_folder/CLIENT_PID holds its fork's pid
        self.forks_folder.mkdir(exist_ok=True)
        os.rename(path + ".binding", path)
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        self.forks: dict[int, Fork] = {}  # by the fork's pid, until it is reaped

    def serve(self) -> dict:
        """Serve until this process is a fork; return the request the fork is to run."""
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.listener:
                    if (request := self.start_one()) is not None:
                        return request
                elif key.fileobj == self.wake_read:
                    self.drain_wakeups()
                    self.reap()
                else:
                    self.client_readable(key.fileobj)

    def stop(self) -> None:
        for pid in self.forks:
            _kill(pid)
        sys.exit(0)

    def start_one(self) -> dict | None:
        connection, _ = self.listener.accept()
        connection.settimeout(30)
        descriptors: list[int] = []
        try:
            header, descriptors, _, _ = socket.recv_fds(connection, 8, 8)
            if len(header) < 8:
                header += receive_exactly(connection, 8 - len(header))
            (size,) = struct.unpack("!Q", header)
            request = json.loads(receive_exactly(connection, size))
        except (OSError, ValueError) as error:
            print(f"forkserver: a bad request ({error})", file=sys.stderr, flush=True)
            for descriptor in descriptors:
                os.close(descriptor)
            connection.close()
            return None
        client_pid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.become_rank(request, descriptors, connection)
            return request
        for descriptor in descriptors:
            os.close(descriptor)
        fork = Fork(connection, self.forks_folder / str(client_pid))
        fork.record.write_text(str(pid))
        self.forks[pid] = fork
        try:
            connection.sendall(struct.pack("!i", pid))
        except OSError:
            _kill(pid)
        connection.setblocking(False)
        self.selector.register(connection, selectors.EVENT_READ, pid)
        return None

    def client_readable(self, connection: socket.socket) -> None:
        if connection.fileno() < 0:
            return  # its rank was reaped earlier in this round of events
        try:
            if connection.recv(64):
                return  # clients send nothing after their request
        except BlockingIOError:
            return
        except OSError:
            pass
        pid = self.selector.get_key(connection).data
        _kill(pid)  # its client was killed: mpirun's kill reaches the rank
        self.close_connection(self.forks[pid])

    def close_connection(self, fork: Fork) -> None:
        if fork.connection is not None:
            self.selector.unregister(fork.connection)
            fork.connection.close()
            fork.connection = None

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fork = self.forks.pop(pid, None)
            if fork is None:
                continue
            if fork.connection is not None:
                fork.connection.setblocking(True)
                with contextlib.suppress(OSError):
                    fork.connection.sendall(struct.pack("!i", status))
                self.close_connection(fork)
            fork.record.unlink(missing_ok=True)

    def drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_read, 512):
                pass
        except BlockingIOError:
            pass

    def become_rank(self, request: dict, descriptors: list[int], connection: socket.socket) -> None:
        """In the fork: drop the server's state and take the client's place."""
        try:
            die_with_parent(signal.SIGKILL)
            os.setpgid(0, 0)  # a process group of its own, as mpirun gives each rank
            signal.set_wakeup_fd(-1)
            for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
                signal.signal(number, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.selector.close()
            others = [fork.connection for fork in self.forks.values() if fork.connection is not None]
            for other in [self.listener, connection, *others]:
                other.close()
            os.close(self.wake_read)
            os.close(self.wake_write)
            take_descriptors(descriptors, request["fds"])
            os.chdir(request["cwd"])
            os.umask(request["umask"])
            os.environ.clear()
            os.environ.update(request["env"])
            added = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry not in sys.path]
            sys.path[1:1] = [entry for entry in added if entry]  # as a fresh start puts them after the script's folder
            if "numpy" in sys.modules:
                sys.modules["numpy"].random.seed()  # a fresh interpreter seeds numpy's global generator anew
        except BaseException:
            traceback.print_exc()
            os._exit(70)


def take_descriptors(received: list[int], targets: list[int]) -> None:
    parked = [fcntl.fcntl(fd, fcntl.F_DUPFD, HIGH_DESCRIPTORS) for fd in received]
    for fd in received:
        os.close(fd)
    for fd, target in zip(parked, targets, strict=True):
        os.dup2(fd, target)
        os.close(fd)


def run_as_main(args: list[str], cwd: str) -> None:
    if args[0] == "-m":
        sys.argv = ["-m", *args[2:]]
        sys.path[0] = cwd
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path[0] = str(Path(args[0]).resolve().parent)
        runpy.run_path(args[0], run_name="__main__")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main() -> None:
    die_with_parent(signal.SIGTERM)
    preload()
    request = ForkServer(sys.argv[1]).serve()
    # A fork from here on: it runs the rank and ends as `python ARGS` ends, through the interpreter's own exit
    # (its atexit and Py_AtExit handlers: mpi4py's MPI_Finalize among them, which mpirun waits for).
    run_as_main(request["args"], request["cwd"])


if __name__ == "__main__":
    main()
