"""Run model-written Python in a separate, resource-limited process.

    result = run_python("print(sum(range(10)))", SandboxLimits(wall_seconds=5))
    result.as_observation()  # "45"

Two backends:

- "bwrap" (bubblewrap): new mount, pid, network, ipc and uts namespaces. Only the
  interpreter's prefix and /usr (with the /lib, /bin links) are mounted, read-only; the
  working folder /tmp is a size-limited tmpfs that vanishes with the sandbox. No network
  device but loopback. Started as root, the code runs as a fresh unprivileged uid with no
  capabilities and no_new_privs.
- "rlimit": a plain subprocess in a new session with rlimits, a clean environment and a
  private temporary working folder; as root it drops to a fresh unprivileged uid and, when it can, to a
  new network namespace. It does not hide world-readable files of the host.

Both apply RLIMIT_CPU/AS/NPROC/FSIZE, give the code no variables of the host, feed the
code on stdin (so `input()` sees end of file) and kill the whole process tree after
`wall_seconds`. docs/sandbox.md says what each backend isolates and what it does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

BACKENDS = ("bwrap", "rlimit")
# Started as root, each run's code gets its own unprivileged uid from this range (no name, owns no
# file): RLIMIT_NPROC then counts that run's processes only, and concurrent runs cannot signal each other.
SANDBOX_UID_BASE = 0x7F000000
SANDBOX_UID_COUNT = 2**24
SANDBOX_DIR = "/tmp"
LANG = "C.UTF-8"
RUN_MARKER_VARIABLE = "AGENTRL_SANDBOX_RUN"
# The working folder holds at most this many max-size files (bwrap's tmpfs size).
FOLDER_FILES = 4
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run; each is enforced by the kernel, not by the code."""

    cpu_seconds: float = 5.0
    """CPU time of each process (RLIMIT_CPU); SIGXCPU at this, SIGKILL one second later."""
    wall_seconds: float = 10.0
    """Wall-clock time after which the whole process tree is killed."""
    memory_mb: int = 512
    """Address space of each process (RLIMIT_AS)."""
    max_processes: int = 64
    """Processes of the sandbox's user (RLIMIT_NPROC); bwrap also confines them to a pid namespace."""
    max_file_mb: int = 16
    """Largest file the code can write (RLIMIT_FSIZE); bwrap's working folder holds 4 of them."""
    max_output_bytes: int = 16_384
    """Bytes kept of stdout and of stderr each; the rest is counted and dropped."""

    def __post_init__(self):
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "max_processes", "max_file_mb", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")


@dataclass
class CodeResult:
    """What one run of `run_python` produced."""

    stdout: str
    stderr: str
    returncode: int | None
    """The exit status, -N when killed by signal N (also for bwrap), None after a timeout."""
    timed_out: bool
    error: str | None
    """None when the code exited 0, else a short reason: timeout, a limit, exception, signal, exit code."""
    backend: str
    seconds: float

    def as_observation(self) -> str:
        """The text the model reads: stdout, then stderr, then the error if stderr does not already say it."""
        parts = [text.rstrip("\n") for text in (self.stdout, self.stderr) if text.strip()]
        if self.error is not None and not self._stderr_explains_error():
            parts.append(f"[error: {self.error}]")
        return "\n".join(parts) if parts else "(no output)"

    def _stderr_explains_error(self) -> bool:
        # A traceback already tells the model what went wrong; "exit code 1" would add nothing.
        return self.returncode == 1 and not self.timed_out and "Traceback" in self.stderr


class SandboxUnavailable(RuntimeError):
    pass


def available_backends() -> list[str]:
    """The backends that work on this machine, best first (probed once per process)."""
    return [name for name in BACKENDS if _unavailable_reason(name) is None]


def run_python(
    code: str,
    limits: SandboxLimits = SandboxLimits(),
    backend: str = "auto",
    files: dict[str, str] | None = None,
) -> CodeResult:
    """Run `code` with a fresh Python interpreter in a sandbox and return what it printed.

    `files` maps relative paths to text written into the working folder before the run.
    `backend` is "bwrap", "rlimit" or "auto" (bwrap if it works here, else rlimit).
    """
    return _execute(code, limits, choose_backend(backend), files or {})


def _execute(code: str, limits: SandboxLimits, backend: str, files: dict[str, str]) -> CodeResult:
    uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_COUNT)
    with tempfile.TemporaryDirectory(prefix="agentrl-sandbox-") as host_dir:
        staged = _stage_files(Path(host_dir), files)
        if backend == "bwrap":
            command, pass_fds = _bwrap_command(limits, staged, uid)
            preexec = None
            env = {}
        else:
            command, pass_fds = [_rlimit_interpreter(), "-I", "-u", "-"], ()
            preexec = functools.partial(_enter_rlimit_sandbox, limits, _rlimit_isolates_network(), uid)
            env = _clean_environment(home=host_dir) | {RUN_MARKER_VARIABLE: uuid.uuid4().hex}
            if os.geteuid() == 0:
                _give_folder_to(host_dir, uid)
        try:
            return _run(command, code, limits, backend, cwd=host_dir, env=env, preexec=preexec, pass_fds=pass_fds)
        finally:
            if backend == "rlimit":
                _kill_marked_processes(env[RUN_MARKER_VARIABLE])


def choose_backend(backend: str = "auto") -> str:
    """The backend `run_python(backend=...)` will use; SandboxUnavailable (naming the fix) when it cannot run here."""
    if backend == "auto":
        if _unavailable_reason("bwrap") is None:
            return "bwrap"
        _warn_rlimit_once(_unavailable_reason("bwrap"))
        backend = "rlimit"
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; use one of {', '.join(BACKENDS)} or 'auto'")
    reason = _unavailable_reason(backend)
    if reason is not None:
        raise SandboxUnavailable(f"sandbox backend {backend!r} cannot run here: {reason}")
    return backend


@functools.cache
def _warn_rlimit_once(bwrap_reason: str) -> None:
    logger.warning(
        "code sandbox: bubblewrap is not usable (%s); running code with the weaker 'rlimit' backend, "
        "which does not hide the host's world-readable files. Install it with `apt install bubblewrap` "
        "(and allow user namespaces when not root).",
        bwrap_reason,
    )


@functools.cache
def _unavailable_reason(backend: str) -> str | None:
    """Why `backend` cannot run on this machine, or None when a probe run printed what it should."""
    if backend == "bwrap" and shutil.which("bwrap") is None:
        return "the `bwrap` binary is not on PATH; install it with `apt install bubblewrap`"
    if backend == "bwrap" and not _base_interpreter().is_file():
        return f"no interpreter at {_base_interpreter()} to mount into the sandbox"
    if backend == "rlimit":
        try:
            _rlimit_interpreter()
        except SandboxUnavailable as error:
            return str(error)
    probe_limits = SandboxLimits(cpu_seconds=5, wall_seconds=20)
    try:
        result = _execute("print(6 * 7)", probe_limits, backend, {})
    except OSError as error:
        return f"starting the probe failed: {error}"
    if result.stdout.strip() != "42":
        return f"a probe run printed {result.stdout!r} with error {result.error!r}; stderr: {result.stderr[-400:]!r}"
    return None


def _stage_files(host_dir: Path, files: dict[str, str]) -> dict[str, Path]:
    """Write the input files under `host_dir`; returns relative path -> host path."""
    staged = {}
    for name, text in files.items():
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ValueError(f"file name {name!r} must be a relative path inside the working folder, without '..'")
        path = host_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        staged[relative.as_posix()] = path
    return staged


def _give_folder_to(folder: str, uid: int) -> None:
    for parent, _, names in os.walk(folder):
        for path in [parent, *(os.path.join(parent, name) for name in names)]:
            os.chown(path, uid, uid)


def _base_interpreter() -> Path:
    """The interpreter of sys.base_prefix: a venv's site-packages are not part of the sandbox."""
    bin_dir = Path(sys.base_prefix) / "bin"
    versioned = bin_dir / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return versioned if versioned.is_file() else bin_dir / "python3"


def _clean_environment(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": LANG}


# ---------------------------------------------------------------------------- bwrap


def _bwrap_command(limits: SandboxLimits, staged: dict[str, Path], uid: int) -> tuple[list[str], tuple[int, ...]]:
    """The bwrap command line and the fds of the input files it copies into the sandbox."""
    interpreter = _base_interpreter()
    prefix = Path(sys.base_prefix).resolve()
    running_as_root = os.geteuid() == 0
    command = ["bwrap", "--die-with-parent", "--new-session", "--clearenv"]
    command += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if running_as_root:
        # No user namespace: the code runs as a real unprivileged uid, so RLIMIT_NPROC applies and it owns nothing.
        command += ["--cap-drop", "ALL"] + [
            arg for cap in ("SETUID", "SETGID", "SETPCAP") for arg in ("--cap-add", f"CAP_{cap}")
        ]
    else:
        command += ["--unshare-user"]
    for name, value in _clean_environment(home=SANDBOX_DIR).items():
        command += ["--setenv", name, value]
    command += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            command += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            command += ["--ro-bind", top, top]
    if not prefix.is_relative_to("/usr"):
        for parent in reversed(prefix.parents[:-1]):
            command += ["--perms", "0755", "--dir", str(parent)]
        command += ["--ro-bind", str(prefix), str(prefix)]
    folder_bytes = str(FOLDER_FILES * limits.max_file_mb * 2**20)
    command += ["--size", folder_bytes, "--perms", "1777", "--tmpfs", SANDBOX_DIR]
    command += ["--proc", "/proc", "--dev", "/dev", "--size", folder_bytes, "--perms", "1777", "--tmpfs", "/dev/shm"]
    fds = []
    for relative, host_path in staged.items():
        for parent in reversed(Path(relative).parents[:-1]):
            command += ["--perms", "0777", "--dir", f"{SANDBOX_DIR}/{parent.as_posix()}"]
        fd = os.open(host_path, os.O_RDONLY)
        fds.append(fd)
        command += ["--perms", "0666", "--file", str(fd), f"{SANDBOX_DIR}/{relative}"]
    command += ["--chdir", SANDBOX_DIR, "/usr/bin/prlimit", *_prlimit_args(limits), "--"]
    if running_as_root:
        command += ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        command += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    command += [str(interpreter), "-I", "-u", "-"]
    return command, tuple(fds)


def _prlimit_args(limits: SandboxLimits) -> list[str]:
    return [f"--{name}={soft}:{hard}" for name, (soft, hard) in _rlimit_values(limits).items()]


def _rlimit_values(limits: SandboxLimits) -> dict[str, tuple[int, int]]:
    """prlimit's name -> (soft, hard). The CPU hard limit is one second later, so SIGXCPU comes first."""
    cpu = math.ceil(limits.cpu_seconds)
    memory = limits.memory_mb * 2**20
    file_size = limits.max_file_mb * 2**20
    return {
        "cpu": (cpu, cpu + 1),
        "as": (memory, memory),
        "nproc": (limits.max_processes, limits.max_processes),
        "fsize": (file_size, file_size),
        "core": (0, 0),
    }


# ---------------------------------------------------------------------------- rlimit

RESOURCE_BY_NAME = {
    "cpu": resource.RLIMIT_CPU,
    "as": resource.RLIMIT_AS,
    "nproc": resource.RLIMIT_NPROC,
    "fsize": resource.RLIMIT_FSIZE,
    "core": resource.RLIMIT_CORE,
}


@functools.cache
def _rlimit_interpreter() -> str:
    """The interpreter the rlimit backend runs: started as root, an unprivileged uid must be able to run it."""
    candidates = [_base_interpreter(), Path("/usr/bin/python3")]
    if os.geteuid() != 0:
        return str(candidates[0])
    for candidate in candidates:
        if candidate.is_file() and _others_can_execute(candidate):
            if candidate != candidates[0]:
                logger.warning(
                    "code sandbox (rlimit): an unprivileged uid cannot reach %s (a parent folder is not o+x); "
                    "running code with %s instead, whose installed packages may differ",
                    candidates[0],
                    candidate,
                )
            return str(candidate)
    raise SandboxUnavailable(
        f"running as root, the rlimit backend runs code as an unprivileged uid, which cannot execute "
        f"{' or '.join(map(str, candidates))}; install bubblewrap, or a Python outside /root"
    )


def _others_can_execute(path: Path) -> bool:
    resolved = path.resolve()
    folders_ok = all(os.stat(parent).st_mode & 0o001 for parent in resolved.parents)
    return folders_ok and os.stat(resolved).st_mode & 0o005 == 0o005


@functools.cache
def _rlimit_isolates_network() -> bool:
    """Whether a child can enter a new network namespace here (root, or unprivileged user namespaces)."""
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "pass"], preexec_fn=_unshare_network, capture_output=True, timeout=30
        )
    except subprocess.SubprocessError:
        return False
    return probe.returncode == 0


def _unshare_network() -> None:
    # Runs between fork and exec: only system calls here, no imports (another thread may hold the import lock).
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWNET | CLONE_NEWUSER
    if LIBC.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")


def _enter_rlimit_sandbox(limits: SandboxLimits, isolate_network: bool, uid: int) -> None:
    """preexec_fn of the rlimit backend: runs in the child between fork and exec."""
    os.setsid()
    if isolate_network:
        _unshare_network()
    for name, (soft, hard) in _rlimit_values(limits).items():
        resource.setrlimit(RESOURCE_BY_NAME[name], (soft, hard))
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _kill_marked_processes(marker: str) -> None:
    """SIGKILL every process whose environment carries `marker` (children that left the session)."""
    needle = f"{RUN_MARKER_VARIABLE}={marker}".encode()
    for _ in range(10):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                environ = Path(entry.path, "environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
        if not found:
            return
        time.sleep(0.01)


# ---------------------------------------------------------------------------- running


class _BoundedReader(threading.Thread):
    """Reads a pipe to its end, keeping the first `limit` bytes and counting the rest."""

    def __init__(self, pipe, limit: int):
        super().__init__(daemon=True)
        self.pipe, self.limit = pipe, limit
        self.kept = bytearray()
        self.dropped = 0

    def run(self):
        while chunk := self.pipe.read1(65536):
            room = self.limit - len(self.kept)
            self.kept += chunk[:room]
            self.dropped += max(0, len(chunk) - room)

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[output truncated: {self.dropped} more bytes not shown]"
        return text


def _run(command, code, limits, backend, *, cwd, env, preexec, pass_fds) -> CodeResult:
    start = time.monotonic()
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=preexec is None,
            preexec_fn=preexec,
            pass_fds=pass_fds,
        )
    finally:
        for fd in pass_fds:
            os.close(fd)
    readers = [
        _BoundedReader(process.stdout, limits.max_output_bytes),
        _BoundedReader(process.stderr, limits.max_output_bytes),
    ]
    for reader in readers:
        reader.start()
    feeder = threading.Thread(target=_feed, args=(process.stdin, code.encode("utf-8")), daemon=True)
    feeder.start()
    timed_out = False
    try:
        returncode = process.wait(timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(process.pid)
        returncode = process.wait()
    if backend == "rlimit":
        # Children the code left in its session. (bwrap: they died with the pid namespace.)
        _kill_group(process.pid)
    if backend == "bwrap" and returncode > 128:
        returncode = 128 - returncode  # bwrap exits 128 + N when the code was killed by signal N
    for reader in readers:
        # A child that escaped the kill may hold the pipe open; its output is then cut here.
        reader.join(timeout=1.0)
    stdout, stderr = (reader.text() for reader in readers)
    seconds = time.monotonic() - start
    error = _describe_failure(returncode, timed_out, stderr, limits)
    return CodeResult(stdout, stderr, None if timed_out else returncode, timed_out, error, backend, seconds)


def _feed(pipe, data: bytes) -> None:
    # BrokenPipeError: the code exited before reading all of itself (e.g. killed); its result says why.
    with contextlib.suppress(BrokenPipeError):
        pipe.write(data)
    with contextlib.suppress(BrokenPipeError):
        pipe.close()


def _kill_group(pgid: int) -> None:
    # ProcessLookupError: the group is gone; PermissionError: only zombies are left (some kernels).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _describe_failure(returncode: int, timed_out: bool, stderr: str, limits: SandboxLimits) -> str | None:
    if timed_out:
        return f"timeout: killed after {limits.wall_seconds:g} s wall time"
    if returncode == 0:
        return None
    signal_number = -returncode if returncode < 0 else 0
    if signal_number == signal.SIGXCPU:
        return f"CPU time limit: killed after {math.ceil(limits.cpu_seconds)} s of CPU time"
    if signal_number == signal.SIGKILL:
        return f"killed by signal {signal_number} (SIGKILL: CPU hard limit, or the machine ran out of memory)"
    if signal_number:
        return f"killed by signal {signal_number} ({_signal_name(signal_number)})"
    last_line = stderr.strip().rsplit("\n", 1)[-1]
    if last_line.startswith("MemoryError"):
        return f"memory limit: MemoryError (limit {limits.memory_mb} MB of address space)"
    if "File too large" in last_line:
        return f"file size limit: writes past {limits.max_file_mb} MB fail ({last_line})"
    if returncode == 1 and "Traceback" in stderr:
        return f"exception: {last_line[:200]}"
    return f"exit code {returncode}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
