"""Run model-written Python in a separate, resource-limited process.

    result = run_python("print(sum(range(10)))", SandboxLimits(wall_seconds=5))
    result.as_observation()  # "45"

Two backends:

- "bwrap" (bubblewrap): new mount, pid, network, ipc and uts namespaces. Only the
  interpreter's prefix and /usr (with the /lib, /bin links) are mounted, read-only; the
  working folder /tmp is a size-limited tmpfs that vanishes with the sandbox. No network
  device but loopback. Started as root, the code runs as a fresh unprivileged uid with no
  capabilities and no_new_privs.
- "rlimit": a plain subprocess in a new session with rlimits and a clean environment. As
  root it drops to a fresh unprivileged uid, enters a new network namespace when it can, and
  a new mount namespace in which every mount is read-only except a private, size-limited
  /tmp (the working folder) and /dev/shm; after the run every process of that uid is killed.
  It does not hide world-readable files of the host. Started as a normal user it contains
  neither writes nor processes that leave the session: `uncontained()` says so.

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
from collections.abc import Callable
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
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
# Per-mount flags a read-only remount keeps (a bind remount sets all of them at once).
KEPT_MOUNT_FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
# The rlimit backend's writable folders (as root): private tmpfs mounts, like bwrap's; /tmp is the working folder.
PRIVATE_FOLDERS = (SANDBOX_DIR, "/dev/shm")
PR_SET_NO_NEW_PRIVS = 38


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
            leftovers = None  # the pid namespace ends with bwrap, and every process in it
        else:
            command, pass_fds = [_rlimit_interpreter(), "-I", "-u", "-"], ()
            private = _rlimit_private_mounts()
            staged_bytes = {relative: path.read_bytes() for relative, path in staged.items()} if private else None
            preexec = functools.partial(_enter_rlimit_sandbox, limits, _rlimit_isolates_network(), uid, staged_bytes)
            marker = uuid.uuid4().hex
            env = _clean_environment(home=SANDBOX_DIR if private else host_dir) | {RUN_MARKER_VARIABLE: marker}
            if os.geteuid() == 0:
                _give_folder_to(host_dir, uid)
            leftovers = functools.partial(_kill_rlimit_leftovers, uid, marker)
        return _run(_Launch(command, host_dir, env, preexec, pass_fds, leftovers), code, limits, backend)


def uncontained(backend: str) -> list[str]:
    """What `backend` does not contain on this machine, beyond what docs/sandbox.md says of both; [] for bwrap.

    The rlimit backend contains writes and processes only when started as root (a private mount
    namespace, a uid of its own); python_tool refuses it otherwise unless allowed.
    """
    if backend != "rlimit":
        return []
    gaps = []
    if not _rlimit_private_mounts():
        where = "" if os.geteuid() == 0 else "the calling user's own files and "
        gaps.append(f"writes: the code can create files in {where}the host's world-writable /tmp, /dev/shm, /var/tmp")
    if os.geteuid() != 0:
        gaps.append(
            "processes: a process that leaves the session (setsid) and replaces its environment outlives the run, "
            "and the code can signal the caller's processes"
        )
    return gaps


def require_contained(backend: str, allow_weak: bool, allow_field: str) -> None:
    """SandboxUnavailable, naming `allow_field` and bubblewrap, when `backend` leaves something uncontained here."""
    gaps = uncontained(backend)
    if gaps and not allow_weak:
        raise SandboxUnavailable(
            f"sandbox backend {backend!r} does not contain model code on this machine: {'; '.join(gaps)}. "
            "Install bubblewrap (`apt install bubblewrap`; docs/sandbox.md), run as root, or accept the weaker "
            f"sandbox with {allow_field}=true"
        )


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


def _enter_rlimit_sandbox(
    limits: SandboxLimits, isolate_network: bool, uid: int, private_files: dict[str, bytes] | None
) -> None:
    """preexec_fn of the rlimit backend: runs in the child between fork and exec.

    `private_files` (root only): enter a private mount namespace and write these files into its /tmp.
    """
    os.setsid()
    if isolate_network:
        _unshare_network()
    if private_files is not None:
        _private_mounts(limits, uid)
        _write_files(SANDBOX_DIR, private_files, uid)
        os.chdir(SANDBOX_DIR)
        if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    for name, (soft, hard) in _rlimit_values(limits).items():
        resource.setrlimit(RESOURCE_BY_NAME[name], (soft, hard))
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _private_mounts(limits: SandboxLimits, uid: int) -> None:
    """A new mount namespace: every mount read-only, then fresh tmpfs mounts owned by `uid` on PRIVATE_FOLDERS.

    Nothing here reaches the host's mounts (they are made private first), and the tmpfs
    mounts vanish with the namespace's last process. Runs between fork and exec (root).
    """
    if LIBC.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    with open("/proc/self/mountinfo") as table:
        mounts = [line.split() for line in table]
    for fields in mounts:  # fields[4]: mount point (octal escapes), fields[5]: its per-mount options
        flags = sum(flag for name, flag in KEPT_MOUNT_FLAGS.items() if name in fields[5].split(","))
        _mount(None, _unescape_mount_point(fields[4]), None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    size = FOLDER_FILES * limits.max_file_mb * 2**20
    for folder in PRIVATE_FOLDERS:
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700,uid={uid},gid={uid}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encoded = [None if text is None else os.fsencode(text) for text in (source, target, fstype, data)]
    if LIBC.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]) != 0:
        errno_value = ctypes.get_errno()
        raise OSError(errno_value, f"mount {target} (flags {flags:#x}) failed: {os.strerror(errno_value)}")


def _unescape_mount_point(field: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as octal escapes."""
    for escaped, character in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, character)
    return field


def _write_files(folder: str, files: dict[str, bytes], uid: int) -> None:
    """Write the input files (relative paths, checked by _stage_files) under `folder`, owned by `uid`."""
    for relative, data in files.items():
        path = os.path.join(folder, relative)
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
        for owned in (path, *_folders_between(folder, parent)):
            os.chown(owned, uid, uid)


def _folders_between(top: str, folder: str) -> list[str]:
    """`folder` and its parents below `top`."""
    folders = []
    while folder != top:
        folders.append(folder)
        folder = os.path.dirname(folder)
    return folders


@functools.cache
def _rlimit_private_mounts() -> bool:
    """Whether the rlimit backend gets a private mount namespace here: root with CAP_SYS_ADMIN (a probe child
    that runs the base interpreter, as sandboxed code does: this process's may sit under a folder the namespace
    replaces, such as a venv in /tmp)."""
    if os.geteuid() != 0:
        return False
    probe = functools.partial(_private_mounts, SandboxLimits(max_file_mb=1), SANDBOX_UID_BASE)
    interpreter = _base_interpreter()
    try:
        result = subprocess.run([interpreter, "-c", "pass"], preexec_fn=probe, capture_output=True, timeout=30)
    except subprocess.SubprocessError as error:  # "Exception occurred in preexec_fn": a mount was refused
        logger.warning("code sandbox (rlimit): no private mount namespace here (%s); writes are not contained", error)
        return False
    except FileNotFoundError:
        logger.warning(
            "code sandbox (rlimit): %s is hidden in the private mount namespace (it lies under %s); writes are not "
            "contained. Install Python outside those folders to contain them",
            interpreter,
            " or ".join(PRIVATE_FOLDERS),
        )
        return False
    return result.returncode == 0


def _kill_rlimit_leftovers(uid: int, marker: str) -> None:
    """After a run: as root, every process of the run's uid; otherwise the processes that kept the run's marker."""
    if os.geteuid() == 0:
        _kill_every_process_of(uid)
    else:
        _kill_marked_processes(marker)


def _kill_every_process_of(uid: int) -> None:
    """SIGKILL every process of `uid` at once, daemons that left the session included.

    A child that becomes `uid` calls kill(-1): the kernel signals every process that uid may
    signal in one pass, so a fork bomb cannot outrun it. The child itself is spared by kill(-1).
    """
    pid = os.fork()
    if pid == 0:  # only system calls until _exit: other threads of this process may hold locks
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


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


@dataclass(frozen=True)
class _Launch:
    """How the sandboxed interpreter starts: its command, working folder and environment, what runs in the child
    before it (rlimit: `preexec`), the descriptors it inherits (bwrap: `pass_fds`), and what kills the processes the
    code left behind once it ended (rlimit: `leftovers`)."""

    command: list[str]
    cwd: str
    env: dict[str, str]
    preexec: Callable[[], None] | None
    pass_fds: tuple[int, ...]
    leftovers: Callable[[], None] | None = None


def _run(launch: _Launch, code: str, limits, backend: str) -> CodeResult:
    command, cwd, env, preexec, pass_fds, leftovers = (
        launch.command,
        launch.cwd,
        launch.env,
        launch.preexec,
        launch.pass_fds,
        launch.leftovers,
    )
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
        kill_group(process.pid)
        returncode = process.wait()
    if backend == "rlimit":
        # Children the code left in its session, then those that left it. (bwrap: they died with the pid namespace.)
        kill_group(process.pid)
        leftovers()
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


def kill_group(pgid: int) -> None:
    """SIGKILL to every process of group `pgid` (a child started in a session of its own has its pid as the group):
    what sandboxed code, or an agent program (agentrl/gateway/agent_process.py), left running."""
    # ProcessLookupError: the group is gone; PermissionError: only zombies are left (some kernels).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
