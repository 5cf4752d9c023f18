"""The code sandbox: normal runs, and hostile snippets that must be contained and reported.

Each hostile case runs on every available backend; `HOSTILE_CASES` and `problems` are also
what benchmarks/bench_sandbox.py runs, so its table checks containment the same way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentrl.env import code_sandbox
from agentrl.env.code_sandbox import CodeResult, SandboxLimits, SandboxUnavailable, available_backends, run_python
from tests.apt import ensure

HOSTILE_LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_mb=128, max_processes=32, max_file_mb=1)
# A run may end this long after wall_seconds: the kill, reaping and reading the pipes.
KILL_SLACK_SECONDS = 3.0


@dataclass
class Host:
    """What a hostile snippet aims at: a secret file, a folder, a listening socket, the host's pid and env."""

    folder: Path
    secret: str = field(default_factory=lambda: f"secret-{uuid.uuid4().hex}")
    process_name: str = field(default_factory=lambda: f"sbx{uuid.uuid4().hex[:12]}")
    shared_name: str = field(default_factory=lambda: f"agentrl-hostile-{uuid.uuid4().hex}")
    """A file name the code tries to create in the host's shared temporary folders."""
    listener: socket.socket | None = None

    def __post_init__(self):
        self.secret_file.write_text(self.secret)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)

    @property
    def secret_file(self) -> Path:
        return self.folder / "secret.txt"

    @property
    def outside_file(self) -> Path:
        return self.folder / "written-from-sandbox.txt"

    @property
    def port(self) -> int:
        return self.listener.getsockname()[1]

    def fields(self) -> dict[str, object]:
        return {
            "secret_file": str(self.secret_file),
            "outside_file": str(self.outside_file),
            "port": self.port,
            "host_pid": os.getpid(),
            "process_name": self.process_name,
            "shared_name": self.shared_name,
        }

    def shared_file(self, folder: str) -> Path:
        return Path(folder) / self.shared_name

    def someone_connected(self) -> bool:
        try:
            connection, _ = self.listener.accept()
        except BlockingIOError:
            return False
        connection.close()
        return True

    def sandbox_processes(self) -> list[int]:
        """Pids of live processes named `process_name` (the fork bomb names itself so).

        Zombies do not count: killed orphans wait for the machine's init to reap them.
        """
        pids = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    name = Path(entry.path, "comm").read_text().strip()
                    state = Path(entry.path, "stat").read_text().rsplit(") ", 1)[1][0]
                except OSError:
                    continue
                if name == self.process_name and state != "Z":
                    pids.append(int(entry.name))
        return pids

    def close(self):
        self.listener.close()
        for folder in SHARED_FOLDERS:
            self.shared_file(folder).unlink(missing_ok=True)


# World-writable on most hosts: what code running as any uid could fill, or leave files in for later runs.
SHARED_FOLDERS = ("/tmp", "/dev/shm", "/var/tmp")


@dataclass(frozen=True)
class HostileCase:
    name: str
    code: str
    """Formatted with Host.fields()."""
    check: Callable[[CodeResult, Host], list[str]] = lambda result, host: []
    """Extra problems beyond the common ones (no error reported, secret leaked, too slow)."""
    fails: bool = True
    """The run must be reported as a failure; False: the code may succeed, as long as the host is untouched."""
    needs_other_uid: bool = False
    """Only contained when the code runs as another user (bwrap, or rlimit started as root)."""
    needs_network_isolation: bool = False
    needs_private_mounts: bool = False
    """Only contained with a private mount namespace (bwrap, or rlimit started as root; `uncontained()`)."""
    needs_uid_kill: bool = False
    """Only contained when every process of the run can be found after it (bwrap, or rlimit started as root)."""


def _no_outside_file(result: CodeResult, host: Host) -> list[str]:
    return [f"{host.outside_file} was created"] if host.outside_file.exists() else []


def _no_connection(result: CodeResult, host: Host) -> list[str]:
    return ["the listener on 127.0.0.1 accepted a connection"] if host.someone_connected() else []


def _no_leftover_processes(result: CodeResult, host: Host) -> list[str]:
    deadline = time.monotonic() + 2.0
    while (left := host.sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [f"{len(left)} processes named {host.process_name} outlived the run"] if left else []


def _no_file_in(folder: str) -> Callable[[CodeResult, Host], list[str]]:
    def check(result: CodeResult, host: Host) -> list[str]:
        return [f"{host.shared_file(folder)} was created on the host"] if host.shared_file(folder).exists() else []

    return check


# Forks a child that leaves the session, drops the run's environment (the rlimit backend's marker) and sleeps.
SETSID_DAEMON = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    '        sleeper = "import ctypes, time; ctypes.CDLL(None).prctl(15, {process_name!r}.encode(), 0, 0, 0); '
    'time.sleep(60)"\n'
    "        os.execve(sys.executable, [sys.executable, '-c', sleeper], {{}})\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "print('daemon started')\n"
)


def _daemon_started_and_gone(result: CodeResult, host: Host) -> list[str]:
    started = [] if "daemon started" in result.stdout else [f"the code did not start its daemon: {result!r}"]
    return started + _no_leftover_processes(result, host)


def _says(*words: str) -> Callable[[CodeResult, Host], list[str]]:
    def check(result: CodeResult, host: Host) -> list[str]:
        seen = (result.error or "") + result.as_observation()
        return [] if any(word in seen for word in words) else [f"the result names none of {words}: {result.error!r}"]

    return check


HOSTILE_CASES = [
    HostileCase("read host file", "print(open({secret_file!r}).read())", needs_other_uid=True),
    HostileCase("read /etc/shadow", "print(open('/etc/shadow').read())"),
    HostileCase("write outside", "open({outside_file!r}, 'w').write('pwned')", _no_outside_file, needs_other_uid=True),
    HostileCase(
        "connect to host socket",
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
        _no_connection,
        needs_network_isolation=True,
    ),
    HostileCase(
        "connect to internet",
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)",
        needs_network_isolation=True,
    ),
    HostileCase(
        "fork bomb",
        "import ctypes, os\n"
        "ctypes.CDLL(None).prctl(15, {process_name!r}.encode(), 0, 0, 0)\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n",
        _no_leftover_processes,
    ),
    HostileCase("memory bomb (4 GB)", "b = bytearray(4 * 1024**3)\nprint(len(b))", _says("memory", "MemoryError")),
    HostileCase(
        "memory bomb (growing list)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(2**20))",
        _says("memory", "MemoryError", "SIGKILL"),
    ),
    HostileCase("infinite loop", "while True:\n    pass", _says("CPU", "timeout")),
    HostileCase("kill parent", "import os\nos.kill(os.getppid(), 9)", needs_other_uid=True),
    HostileCase("kill host process", "import os\nos.kill({host_pid}, 9)", needs_other_uid=True),
    HostileCase("env secrets", "import os\nprint(dict(os.environ))\nraise SystemExit(1)"),
    HostileCase("/proc/1/environ", "print(open('/proc/1/environ').read())"),
    HostileCase("host /proc environ", "print(open('/proc/{host_pid}/environ').read())", needs_other_uid=True),
    HostileCase("huge file", "open('big', 'wb').write(b'x' * (64 * 2**20))", _says("file size", "File too large")),
    *(
        HostileCase(
            f"write {folder}",
            f"open('{folder}/{{shared_name}}', 'w').write('left behind')\nprint('written')",
            _no_file_in(folder),
            fails=False,  # writing to a private folder of the same name is fine
            needs_private_mounts=True,
        )
        for folder in SHARED_FOLDERS
    ),
    HostileCase("setsid daemon", SETSID_DAEMON, _daemon_started_and_gone, fails=False, needs_uid_kill=True),
]


def why_not_applicable(case: HostileCase, backend: str) -> str | None:
    """Why `case` is outside what `backend` promises on this machine (docs/sandbox.md), or None."""
    if backend != "rlimit":
        return None
    if case.needs_other_uid and os.geteuid() != 0:
        return "the rlimit backend runs code as the caller's own user when not started as root"
    if case.needs_network_isolation and not code_sandbox._rlimit_isolates_network():
        return "the rlimit backend cannot create a network namespace on this machine"
    if case.needs_private_mounts and not code_sandbox._rlimit_private_mounts():
        return "the rlimit backend gets no private mount namespace here (not root, or no CAP_SYS_ADMIN)"
    if case.needs_uid_kill and os.geteuid() != 0:
        return "the rlimit backend runs code as the caller's own user when not started as root"
    return None


def problems(case: HostileCase, result: CodeResult, host: Host, limits: SandboxLimits) -> list[str]:
    """Everything that shows `case` was not contained, or not reported; empty when it was."""
    found = []
    if case.fails and result.error is None:
        found.append("the run was not reported as a failure")
    if host.secret in result.stdout + result.stderr:
        found.append("the output contains the host's secret")
    if result.seconds > limits.wall_seconds + KILL_SLACK_SECONDS:
        found.append(f"the run took {result.seconds:.1f} s, past the wall limit {limits.wall_seconds} s")
    return found + case.check(result, host)


@pytest.fixture(params=["bwrap", "rlimit"])
def backend(request) -> str:
    if request.param == "bwrap":
        reason = ensure(("bubblewrap",), lambda: shutil.which("bwrap") is not None)
        if reason is not None:
            pytest.skip(reason)
    if request.param not in available_backends():
        pytest.skip(f"backend {request.param} cannot run here: {code_sandbox._unavailable_reason(request.param)}")
    return request.param


@pytest.fixture
def host(tmp_path, monkeypatch):
    outside = tmp_path / "host"
    outside.mkdir()
    host = Host(outside)
    monkeypatch.setenv("AGENTRL_TEST_SECRET", host.secret)
    yield host
    host.close()


@pytest.mark.parametrize("case", HOSTILE_CASES, ids=[case.name for case in HOSTILE_CASES])
def test_hostile_code_is_contained_and_reported(case, backend, host):
    reason = why_not_applicable(case, backend)
    if reason is not None:
        pytest.skip(reason)
    result = run_python(case.code.format(**host.fields()), HOSTILE_LIMITS, backend=backend)
    assert result.backend == backend
    assert problems(case, result, host, HOSTILE_LIMITS) == [], result


def test_print_and_unicode(backend):
    result = run_python("print('héllo ✓ 你好', 6 * 7)", backend=backend)
    assert (result.stdout, result.error, result.returncode) == ("héllo ✓ 你好 42\n", None, 0)
    assert result.as_observation() == "héllo ✓ 你好 42"


def test_exception_comes_back_as_traceback(backend):
    result = run_python("def f():\n    return {}['missing']\nprint('before')\nf()", backend=backend)
    assert result.returncode == 1
    assert "KeyError: 'missing'" in result.error
    assert "Traceback" in result.stderr and "line 2, in f" in result.stderr
    assert result.as_observation().startswith("before\nTraceback")


def test_exit_code_is_reported(backend):
    result = run_python("import sys\nsys.exit(3)", backend=backend)
    assert (result.returncode, result.error) == (3, "exit code 3")
    assert "[error: exit code 3]" in result.as_observation()


def test_output_is_truncated_and_says_so(backend):
    limits = SandboxLimits(max_output_bytes=100)
    result = run_python("print('a' * 5000)\nimport sys\nsys.stderr.write('b' * 300)", limits, backend=backend)
    assert result.stdout.startswith("a" * 100 + "\n[output truncated: 4901 more bytes")
    assert result.stderr.startswith("b" * 100 + "\n[output truncated: 200 more bytes")
    assert result.error is None


def test_files_are_put_in_the_working_folder(backend):
    files = {"data.txt": "3\n4\n", "sub/dir/notes.md": "ünïcode"}
    code = "import os\nprint(sum(map(int, open('data.txt'))), open('sub/dir/notes.md').read(), os.listdir('.'))"
    result = run_python(code, backend=backend, files=files)
    assert result.error is None, result
    numbers, text, listing = result.stdout.split(" ", 2)
    assert (numbers, text) == ("7", "ünïcode")
    assert sorted(eval(listing)) == ["data.txt", "sub"]


def test_working_folder_is_private_and_deleted(backend):
    name = f"left-{uuid.uuid4().hex}.txt"
    first = run_python(f"import os\nopen({name!r}, 'w').write('x')\nprint(os.getcwd())", backend=backend)
    second = run_python("import os\nprint(os.listdir('.'))", backend=backend)
    assert first.error is None and second.stdout == "[]\n"
    assert not (Path(first.stdout.strip()) / name).exists()  # not on the host: deleted, or never there


def test_environment_is_clean(backend, monkeypatch):
    monkeypatch.setenv("PMI_RANK", "3")
    result = run_python("import os\nprint(sorted(os.environ))", backend=backend)
    names = set(eval(result.stdout))
    assert names <= {"PATH", "HOME", "LANG", "TMPDIR", "PWD", code_sandbox.RUN_MARKER_VARIABLE}
    assert "PMI_RANK" not in names


def test_input_sees_end_of_file(backend):
    result = run_python("input()", backend=backend)
    assert "EOFError" in result.error


def test_bad_file_names_are_refused():
    for name in ("/etc/passwd", "../up.txt", "a/../../b"):
        with pytest.raises(ValueError, match="relative path"):
            run_python("pass", files={name: "x"})


def test_unknown_or_unavailable_backend_names_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="use one of bwrap, rlimit"):
        run_python("pass", backend="docker")
    code_sandbox._unavailable_reason.cache_clear()
    monkeypatch.setattr(code_sandbox.shutil, "which", lambda name: None)
    try:
        with pytest.raises(SandboxUnavailable, match="apt install bubblewrap"):
            run_python("pass", backend="bwrap")
    finally:
        code_sandbox._unavailable_reason.cache_clear()


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="memory_mb must be > 0"):
        SandboxLimits(memory_mb=0)


def test_process_limit_stops_fork(backend):
    code = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(2)\n            os._exit(0)\n        n += 1\nexcept OSError as error:\n"
        "    print(n, error.errno)\n"
    )
    result = run_python(code, SandboxLimits(max_processes=10, wall_seconds=8), backend=backend)
    forked, errno_value = map(int, result.stdout.split())
    assert 1 <= forked < 10 and errno_value == 11, result


def test_signal_deaths_read_the_same_on_every_backend(backend):
    result = run_python("import os\nprint('before')\nos.kill(os.getpid(), 11)", backend=backend)
    assert (result.returncode, result.error) == (-11, "killed by signal 11 (SIGSEGV)")
    assert result.as_observation() == "before\n[error: killed by signal 11 (SIGSEGV)]"


def test_cpu_limit_ends_a_busy_loop_before_the_wall_limit(backend):
    result = run_python("while True:\n    pass", SandboxLimits(cpu_seconds=1, wall_seconds=60), backend=backend)
    assert not result.timed_out and result.error.startswith("CPU time limit"), result
    assert result.returncode == -24  # SIGXCPU


def test_auto_falls_back_to_rlimit_with_one_warning(monkeypatch, caplog):
    if "rlimit" not in available_backends():
        pytest.skip(f"rlimit cannot run here: {code_sandbox._unavailable_reason('rlimit')}")
    real_reason = code_sandbox._unavailable_reason
    monkeypatch.setattr(
        code_sandbox, "_unavailable_reason", lambda name: "bwrap missing" if name == "bwrap" else real_reason(name)
    )
    code_sandbox._warn_rlimit_once.cache_clear()
    results = [run_python("print(1)") for _ in range(2)]
    assert [result.backend for result in results] == ["rlimit", "rlimit"]
    warnings = [record.getMessage() for record in caplog.records if "bubblewrap is not usable" in record.getMessage()]
    assert len(warnings) == 1 and "apt install bubblewrap" in warnings[0]


def test_auto_prefers_bwrap():
    if "bwrap" not in available_backends():
        pytest.skip(f"bwrap cannot run here: {code_sandbox._unavailable_reason('bwrap')}")
    assert run_python("print(1)").backend == "bwrap"


def test_the_working_folder_is_the_only_writable_place(backend):
    """Writable: the working folder (and /dev/shm, for multiprocessing); the rest of the system: read-only or absent."""
    if backend == "rlimit" and code_sandbox.uncontained("rlimit"):
        pytest.skip(f"rlimit does not contain writes here: {code_sandbox.uncontained('rlimit')}")
    code = (
        "import multiprocessing, os\n"
        "multiprocessing.Lock()\n"  # a POSIX semaphore in /dev/shm
        "for folder in ('.', os.environ['TMPDIR'], '/dev/shm', '/var/tmp', '/run/lock', '/usr', '/'):\n"
        "    try:\n"
        "        open(os.path.join(folder, 'probe'), 'w').close()\n"
        "        print(folder, 'writable')\n"
        "    except OSError as error:\n"
        "        print(folder, type(error).__name__)\n"
    )
    result = run_python(code, backend=backend)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert result.error is None, result
    assert lines.pop(".") == lines.pop("/tmp") == lines.pop("/dev/shm") == "writable"
    assert all(outcome != "writable" for outcome in lines.values()), lines


NON_ROOT_PROBE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("code_sandbox", sys.argv[1])
sandbox = sys.modules["code_sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
print(sandbox.uncontained("rlimit"))
try:
    sandbox.require_contained("rlimit", allow_weak=False, allow_field="env.kwargs.allow_weak_sandbox")
except sandbox.SandboxUnavailable as error:
    print(error)
sandbox.require_contained("rlimit", allow_weak=True, allow_field="env.kwargs.allow_weak_sandbox")
"""


def test_rlimit_says_what_it_does_not_contain_when_not_root():
    """Run as an unprivileged user (from root: uid 65534 through setpriv), with the standard library only."""
    command = [sys.executable, "-c", NON_ROOT_PROBE, code_sandbox.__file__]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv (util-linux) to run as another user")
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", *command[1:]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd="/")
    if "Permission denied" in result.stderr:
        pytest.skip(f"uid 65534 cannot read {code_sandbox.__file__}")
    assert result.returncode == 0, result.stderr
    gaps, refusal = result.stdout.splitlines()[:2]
    assert "writes:" in gaps and "/tmp, /dev/shm, /var/tmp" in gaps and "processes:" in gaps
    assert refusal.startswith("sandbox backend 'rlimit' does not contain model code on this machine")
    assert "apt install bubblewrap" in refusal and "env.kwargs.allow_weak_sandbox=true" in refusal


def test_rlimit_as_root_contains_writes_and_processes():
    if os.geteuid() != 0:
        pytest.skip("the rlimit backend contains writes and processes only when started as root")
    if not code_sandbox._rlimit_private_mounts():
        pytest.skip("no private mount namespace here (no CAP_SYS_ADMIN)")
    assert code_sandbox.uncontained("rlimit") == []


def test_the_private_mount_probe_runs_the_sandboxs_interpreter_not_a_venvs_in_tmp(monkeypatch, tmp_path):
    # A venv under /tmp is hidden once the namespace mounts a private /tmp; the probe used to exec it and crash.
    if os.geteuid() != 0 or not code_sandbox._rlimit_private_mounts():
        pytest.skip("needs root with a private mount namespace")
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    monkeypatch.setattr(code_sandbox.sys, "executable", str(venv_python))
    assert str(tmp_path).startswith(code_sandbox.SANDBOX_DIR)
    assert code_sandbox._rlimit_private_mounts.__wrapped__() is True
