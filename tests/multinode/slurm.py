"""A real SLURM across the test bed: munged, slurmctld on node0 and one slurmd per node, each in its namespaces.

    python -m tests.multinode.slurm up 2     # nodes (cluster.up) + daemons; prints the SLURM_CONF to export
    SLURM_CONF=/var/tmp/agentrl-multinode/slurm/slurm.conf sbatch -N 2 slurm/train.sh launch/configs/quickstart.yaml
    python -m tests.multinode.slurm down     # daemons (by their pids), then the nodes

Each slurmd is `slurmd -D -N nodeK` inside node k, listening on its own address; they share one
slurm.conf (NodeName=nodeK NodeAddr=10.213.0.(K+1)), whose spool, pid and log paths carry `%n`.
Clients on the host reach slurmctld through the bridge (10.213.0.254 -> 10.213.0.1).
munged runs on the host; its socket is a file every node sees (AF_UNIX crosses network namespaces).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.multinode import cluster
from tests.slurm.cluster import _tool, install_packages

ROOT_DIR = cluster.STATE / "slurm"
CTLD_PORT, SLURMD_PORT = 6917, 6918  # on the bridge's private addresses only


def config_lines(root: Path, count: int, cpus: int) -> list[str]:
    names = ",".join(cluster.node_name(k) for k in range(count))
    lines = [
        "ClusterName=agentrlmulti",
        f"SlurmctldHost={cluster.node_name(0)}({cluster.node_address(0)})",
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'},cred_expire=10",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "KillWait=10",
        "SlurmdTimeout=30",
        "SchedulerParameters=sched_interval=5",
        "MinJobAge=600",
    ]
    lines += [
        f"NodeName={cluster.node_name(k)} NodeAddr={cluster.node_address(k)} CPUs={cpus} State=UNKNOWN"
        for k in range(count)
    ]
    lines.append(f"PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return lines


def client_env() -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(ROOT_DIR / "slurm.conf")}


def _spawn(argv: list[str], log: str) -> int:
    out = open(ROOT_DIR / "log" / log, "w")  # noqa: SIM115 (the daemon's log, open while it runs)
    return subprocess.Popen(argv, env=client_env(), stdout=out, stderr=out, start_new_session=True).pid


def _idle(count: int) -> bool:
    result = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--format=%N %t"], env=client_env(), capture_output=True, text=True
    )
    states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
    return result.returncode == 0 and len(states) == count and set(states.values()) == {"idle"}


def up(count: int, cpus: int = 4, timeout_s: float = 60) -> dict[str, int]:
    """Nodes, then munged, slurmctld on node0, slurmd on each node. Returns {daemon: pid}."""
    why = install_packages()
    if why:
        raise RuntimeError(why)
    down()
    cluster.up(count)
    return start(count, cpus, timeout_s)


def start(count: int, cpus: int = 4, timeout_s: float = 60) -> dict[str, int]:
    """The daemons on nodes that are up (`cluster.up(count)`). Returns {daemon: pid}."""
    for sub in ("munge", "state", "spool", "log"):
        (ROOT_DIR / sub).mkdir(parents=True, exist_ok=True)
    for k in range(count):
        (ROOT_DIR / "spool" / cluster.node_name(k)).mkdir(exist_ok=True)
    os.chmod(ROOT_DIR / "munge", 0o700)
    (ROOT_DIR / "slurm.conf").write_text("\n".join(config_lines(ROOT_DIR, count, cpus)) + "\n")
    munge = ROOT_DIR / "munge"
    key = munge / "munge.key"
    subprocess.run([_tool("mungekey"), "--create", "--force", f"--keyfile={key}"], check=True, capture_output=True)
    pids = {}
    pids["munged"] = _spawn(
        [
            _tool("munged"),
            "--foreground",
            "--force",
            f"--socket={munge / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ],
        "munged.out",
    )
    (ROOT_DIR / "daemons.json").write_text(json.dumps(pids))
    deadline = time.monotonic() + timeout_s
    while not (munge / "munge.socket").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"munged did not open its socket; see {ROOT_DIR / 'log'}")
        time.sleep(0.2)
    pids["slurmctld"] = _spawn(cluster.exec_argv(0, [_tool("slurmctld"), "-D", "-i"]), "slurmctld.out")
    for k in range(count):
        name = cluster.node_name(k)
        pids[f"slurmd-{name}"] = _spawn(cluster.exec_argv(k, [_tool("slurmd"), "-D", "-N", name]), f"slurmd-{name}.out")
    (ROOT_DIR / "daemons.json").write_text(json.dumps(pids))
    while not _idle(count):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the {count} nodes did not become idle in sinfo in {timeout_s} s; see {ROOT_DIR / 'log'}"
            )
        time.sleep(0.5)
    return pids


def down() -> None:
    """Stop the daemons, then the nodes."""
    stop()
    cluster.down()


def stop() -> None:
    """Stop the daemons this module started (by the pids it recorded) and remove their folder."""
    record = ROOT_DIR / "daemons.json"
    pids = json.loads(record.read_text()) if record.exists() else {}
    for pid in pids.values():  # the nsenter'd daemons are the pids themselves (nsenter execs)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for pid in pids.values():
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
    record.unlink(missing_ok=True)
    if ROOT_DIR.exists():
        subprocess.run(["rm", "-rf", str(ROOT_DIR)], check=False)


def main(argv: list[str]) -> int:
    if argv[:1] == ["up"] and len(argv) == 2:
        for name, pid in up(int(argv[1])).items():
            print(f"{name} pid {pid}")
        print(f"export SLURM_CONF={ROOT_DIR / 'slurm.conf'}")
        return 0
    if argv == ["down"]:
        down()
        return 0
    print("usage: python -m tests.multinode.slurm up N | down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
