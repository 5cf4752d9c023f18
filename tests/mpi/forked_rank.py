"""`python -S forked_rank.py ARGS...`: start one rank of a test job as a fork of the preloaded test parent
(tests/mpi/forkserver.py) instead of a fresh interpreter, where `AGENTRL_TEST_FORKSERVER` names its socket.

mpirun starts this small process in the rank's place. It hands the parent its arguments, working folder,
environment and open descriptors (stdio, and MPICH's PMI_FD), forwards the signals it gets to the forked rank, and
exits as the rank did: with its code, or killed by its signal. If this process is killed outright (SIGKILL), the
parent kills the rank. Without a parent to ask, it becomes the rank itself: `python ARGS...`.

Standard library only, and started with -S: it costs milliseconds, not the seconds of a model rank's imports.
"""

import json
import os
import signal
import socket
import struct
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


def start_cold(args: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *args])


def passed_descriptors() -> list[int]:
    descriptors = [0, 1, 2]
    if os.environ.get("PMI_FD", "").isdigit():
        descriptors.append(int(os.environ["PMI_FD"]))
    return [fd for fd in descriptors if _is_open(fd)]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        data += chunk
    return data


def main() -> None:
    args = sys.argv[1:]
    path = os.environ.get("AGENTRL_TEST_FORKSERVER", "")
    if not path or not args or not (args[0] == "-m" or not args[0].startswith("-")):
        start_cold(args)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        start_cold(args)
    descriptors = passed_descriptors()
    request = {"args": args, "cwd": os.getcwd(), "env": dict(os.environ), "fds": descriptors, "umask": _umask()}
    payload = json.dumps(request).encode()
    socket.send_fds(connection, [struct.pack("!Q", len(payload))], descriptors)
    connection.sendall(payload)
    for fd in descriptors[3:]:
        os.close(fd)  # PMI_FD: only the rank holds it, so mpirun sees it close when the rank's MPI finalizes
    (pid,) = struct.unpack("!i", receive_exactly(connection, 4))
    for number in FORWARDED:
        signal.signal(number, lambda received, _frame: os.kill(pid, received))
    try:
        (status,) = struct.unpack("!i", receive_exactly(connection, 4))
    except ConnectionError as error:
        print(f"forked_rank: {error} before rank pid {pid} ended", file=sys.stderr)
        os._exit(1)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        os._exit(128 + number)  # a signal whose default is to be ignored
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


if __name__ == "__main__":
    main()
