"""A timer that interrupts the main thread: how an env call on the rank's own thread keeps its deadline.

A call in a worker thread can be abandoned when it outlives its deadline, but it costs two hand-overs between
threads a batch of calls. A call on the main thread costs none, and no other thread can end it. So the env host
arms this timer before such a batch: a POSIX timer (`timer_create`, CLOCK_MONOTONIC) whose signal goes to the main
thread itself (SIGEV_THREAD_ID). The signal interrupts what the thread is blocked in (a sleep, a socket read, a
lock), and Python runs `on_fire` there, between two bytecodes of whatever was running. `on_fire` may raise
(CallDeadline, inside the env's code) or act and return.

A call the signal cannot end (blocked in C code that retries its wait, or code that catches BaseException) would
hang the rank. So a guard thread, waking every few seconds, ends the job with the main thread's stack once a call
is past the `give_up_at` its host set: the job fails with the reason instead of hanging.

Linux only, on the main thread, with a real-time signal nobody else handles. `MainThreadTimer.get()` returns None
otherwise, and the env host then runs env calls in worker threads. The timer and its signal are made once a
process, on first use.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

from agentrl import transport

# A real-time signal away from both ends of the range (glibc and some runtimes use the first few).
SIGNAL_OFFSET = 6
_SIGEV_THREAD_ID = 4
_CLOCK_MONOTONIC = 1
GUARD_POLL_S = 5.0  # how often the guard thread looks (it needs the GIL only then)
EXIT_STUCK = 1


class CallDeadline(BaseException):
    """Raised inside env code on the main thread at its batch's deadline. A BaseException, so that an env's own
    `except Exception` does not swallow it."""


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):  # Linux's struct sigevent (64 bytes), with its thread id member
    _fields_ = [
        ("sigev_value", ctypes.c_void_p),
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("sigev_notify_thread_id", ctypes.c_int),
        ("_pad", ctypes.c_int * 11),
    ]


def _timespec(seconds: float) -> _Timespec:
    whole = int(seconds)
    return _Timespec(whole, int((seconds - whole) * 1e9))


class MainThreadTimer:
    """One shot (with an optional repeat) of a signal to the main thread, running `on_fire` there."""

    _made: MainThreadTimer | None = None
    _tried = False  # made, or found impossible: only the main thread gets here, so no lock is needed

    def __init__(self, libc, timer_id: ctypes.c_void_p, signum: int):
        self._settime = libc.timer_settime
        self._settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        self._timer, self.signum = timer_id, signum
        self._off = _Itimerspec()
        self.on_fire: Callable[[], None] | None = None
        self.give_up_at: float | None = None  # time.monotonic() past which the guard ends the job
        self.stuck_message = ""  # why, for the guard to print
        self._guard: threading.Thread | None = None

    @classmethod
    def get(cls) -> MainThreadTimer | None:
        """The process's timer, made on first call; None off the main thread and where there can be none."""
        if threading.current_thread() is not threading.main_thread():
            return None
        if not cls._tried:
            cls._made, cls._tried = cls._create(), True
        return cls._made

    @classmethod
    def _create(cls) -> MainThreadTimer | None:
        if not sys.platform.startswith("linux") or not hasattr(signal, "SIGRTMIN"):
            return None
        signum = signal.SIGRTMIN + SIGNAL_OFFSET
        if signum > signal.SIGRTMAX or signal.getsignal(signum) is not signal.SIG_DFL:  # taken by someone else
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create = libc.timer_create
        except (OSError, AttributeError):  # glibc before 2.34 keeps it in librt
            try:
                libc = ctypes.CDLL("librt.so.1", use_errno=True)
                create = libc.timer_create
            except (OSError, AttributeError):
                return None
        create.argtypes = [ctypes.c_int, ctypes.POINTER(_Sigevent), ctypes.POINTER(ctypes.c_void_p)]
        event = _Sigevent(
            sigev_signo=signum, sigev_notify=_SIGEV_THREAD_ID, sigev_notify_thread_id=threading.get_native_id()
        )
        timer_id = ctypes.c_void_p()
        if create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer_id)) != 0:
            return None
        timer = cls(libc, timer_id, signum)
        signal.signal(signum, timer._handle)
        return timer

    @classmethod
    def _forget(cls) -> None:
        """In a forked child: the parent's timer and guard thread are not inherited; make them anew if needed."""
        made, cls._made, cls._tried = cls._made, None, False
        if made is not None:
            with contextlib.suppress(ValueError):  # not the child's main thread: the handler is left, unused
                signal.signal(made.signum, signal.SIG_DFL)

    def arm(self, after_s: float, on_fire: Callable[[], None], repeat_s: float = 0.0) -> None:
        """Run `on_fire` on the main thread in `after_s` seconds (then every `repeat_s`, if given), instead of
        what was armed before."""
        self.on_fire = on_fire
        spec = _Itimerspec(_timespec(repeat_s), _timespec(max(after_s, 1e-6)))
        if self._settime(self._timer, 0, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), f"timer_settime failed: {os.strerror(ctypes.get_errno())}")

    def guard(self, give_up_at: float, message: str) -> None:
        """End the job (printing `message` and the main thread's stack) if the main thread is still in the guarded
        work at `give_up_at` (time.monotonic()); `disarm` ends the watch."""
        self.stuck_message, self.give_up_at = message, give_up_at
        if self._guard is None:
            self._guard = threading.Thread(target=self._watch, name="env-call-guard", daemon=True)
            self._guard.start()

    def disarm(self) -> None:
        self._settime(self._timer, 0, ctypes.byref(self._off), None)
        self.on_fire = None
        self.give_up_at = None

    def _watch(self) -> None:
        main = threading.main_thread().ident
        while True:
            give_up_at = self.give_up_at
            now = time.monotonic()
            if give_up_at is None or now < give_up_at:
                time.sleep(GUARD_POLL_S if give_up_at is None else min(GUARD_POLL_S, give_up_at - now + 0.01))
                continue
            try:
                frame = sys._current_frames().get(main)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)\n"
                sys.stdout.flush()
                sys.stderr.write(f"agentrl (rank {transport.world_rank()}): {self.stuck_message}\n{stack}")
                sys.stderr.flush()
                transport.abort_world(EXIT_STUCK)
            finally:  # whatever failed above (a closed stderr), the process must not be left hanging
                os._exit(EXIT_STUCK)

    def _handle(self, signum, frame) -> None:
        on_fire = self.on_fire
        if on_fire is not None:  # None: a signal sent just before `disarm`, handled after it
            on_fire()


os.register_at_fork(after_in_child=MainThreadTimer._forget)
