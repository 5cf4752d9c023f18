"""Several "nodes" on one machine: network namespaces with their own hostname, /dev/shm and /tmp, on a private bridge.

    python -m tests.multinode.cluster up 2      # node0, node1 on bridge agentrlbr0 (10.213.0.0/24)
    python -m tests.multinode.cluster exec 1 hostname
    python -m tests.multinode.cluster down      # removes every namespace, link and process it made

Node k is a long-lived `sleep` (its "init") in network namespace `agentrl-nK` and in a UTS and
mount namespace of its own: hostname `nodeK`, private tmpfs on /dev/shm and /tmp, and the test
bed's hosts file bound over /etc/hosts so every node resolves every other. It reaches the
others through veth `arnK` (host side) on bridge `agentrlbr0`, at 10.213.0.(K+1); the host
side of the bridge is 10.213.0.254 (SLURM clients outside the nodes). A command runs on node
k by `nsenter -t INIT -n -m -u` (`exec_argv`); `node_ssh` does the same for MPICH's hydra in
place of ssh. The PID namespace is shared: a node's processes are `ip netns pids agentrl-nK`.
State (init pids, hosts file) lives in $AGENTRL_MULTINODE_DIR (default /var/tmp/agentrl-multinode),
outside /tmp so that every node sees it, like the shared filesystem of a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

BRIDGE = "agentrlbr0"
SUBNET = "10.213.0"
HOST_ADDRESS = f"{SUBNET}.254"
NETNS_PREFIX = "agentrl-n"
VETH_PREFIX = "arn"
STATE = Path(os.environ.get("AGENTRL_MULTINODE_DIR", "/var/tmp/agentrl-multinode"))
NODE_SSH = Path(__file__).with_name("node_ssh")


def node_name(index: int) -> str:
    return f"node{index}"


def node_address(index: int) -> str:
    return f"{SUBNET}.{index + 1}"


def host_link(index: int) -> str:
    """The host side of node `index`'s veth: its counters are the bytes that node sent and received."""
    return f"{VETH_PREFIX}{index}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def why_unavailable() -> str | None:
    """Why this machine cannot host the test bed, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (apt-get install iproute2 util-linux)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --net --uts --mount fails here: {probe.stderr.strip()}"
    return None


def nodes() -> dict[str, dict]:
    """{hostname: {"index", "address", "pid"}} of the nodes that are up."""
    path = STATE / "nodes.json"
    return json.loads(path.read_text()) if path.exists() else {}


def exec_argv(node: int | str, argv: list[str], cwd: str | None = None) -> list[str]:
    """`argv` run on `node` (index or hostname): in its network, mount and UTS namespaces."""
    name = node_name(node) if isinstance(node, int) else node
    known = nodes()
    if name not in known:
        raise RuntimeError(
            f"no node {name!r} is up (up: {sorted(known)}); run `python -m tests.multinode.cluster up N`"
        )
    return ["nsenter", "-t", str(known[name]["pid"]), "-n", "-m", "-u", f"--wd={cwd or os.getcwd()}", "--", *argv]


def hosts_file(count: int) -> str:
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{node_address(k)} {node_name(k)}" for k in range(count)]
    return "\n".join(lines) + "\n"


def _start_init(index: int) -> int:
    """Node `index`'s init: enters its netns, unshares UTS and mounts, sets them up, then sleeps."""
    setup = " && ".join(
        [
            f"hostname {node_name(index)}",
            "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
            "mount -t tmpfs -o mode=1777 tmpfs /tmp",
            f"mount --bind {STATE / 'hosts'} /etc/hosts",
            f"touch {STATE / f'{node_name(index)}.ready'}",
            "exec sleep infinity",
        ]
    )
    argv = ["nsenter", f"--net=/run/netns/{NETNS_PREFIX}{index}", "--"]
    argv += ["unshare", "--uts", "--mount", "--propagation", "private", "--", "sh", "-c", setup]
    process = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)
    ready = STATE / f"{node_name(index)}.ready"
    deadline = time.monotonic() + 10
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"node {index}'s init did not start (exit {process.poll()}): {' '.join(argv)}")
        time.sleep(0.05)
    return process.pid


def up(count: int) -> dict[str, dict]:
    """Bring up `count` nodes (down first if a test bed is already up). Returns `nodes()`."""
    if not 1 <= count <= 8:
        raise ValueError(f"{count} nodes: choose 1..8")
    down()
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / "hosts").write_text(hosts_file(count))
    record: dict[str, dict] = {}
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{HOST_ADDRESS}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for k in range(count):
            netns, inside = f"{NETNS_PREFIX}{k}", f"{VETH_PREFIX}{k}x"
            _ip("netns", "add", netns)
            _ip("link", "add", host_link(k), "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", netns)
            _ip("link", "set", host_link(k), "master", BRIDGE)
            _ip("link", "set", host_link(k), "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("-n", netns, "link", "set", inside, "name", "eth0")
            _ip("-n", netns, "addr", "add", f"{node_address(k)}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            record[node_name(k)] = {"index": k, "address": node_address(k), "pid": _start_init(k)}
            (STATE / "nodes.json").write_text(json.dumps(record, indent=1))
    except BaseException:
        down()
        raise
    return record


def node_pids(index: int) -> list[int]:
    """Every process in node `index`'s network namespace (its init included)."""
    result = _ip("netns", "pids", f"{NETNS_PREFIX}{index}", check=False)
    return [int(pid) for pid in result.stdout.split()]


def kill_node(index: int, sig: int = signal.SIGKILL, keep_init: bool = True) -> list[int]:
    """Signal every process on node `index` (a node lost); its init stays unless `keep_init` is false."""
    init = nodes().get(node_name(index), {}).get("pid")
    killed = []
    for pid in node_pids(index):
        if keep_init and pid == init:
            continue
        try:
            os.kill(pid, sig)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def set_link(index: int, up_: bool) -> None:
    """Cut (or restore) node `index`'s cable: its veth's host side down (or up)."""
    _ip("link", "set", host_link(index), "up" if up_ else "down")


def link_bytes(index: int) -> int:
    """Bytes node `index` sent plus received over the bridge so far (its veth's counters)."""
    stats = Path(f"/sys/class/net/{host_link(index)}/statistics")
    return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())


def down() -> None:
    """Remove everything `up` made: processes in the nodes' namespaces, the namespaces, links, bridge, state."""
    listed = _ip("netns", "list", check=False).stdout.split()
    ours = sorted({name for name in listed if name.startswith(NETNS_PREFIX) and name[len(NETNS_PREFIX) :].isdigit()})
    for netns in ours:
        index = int(netns[len(NETNS_PREFIX) :])
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not node_pids(index):
                break
            kill_node(index, sig, keep_init=False)
            deadline = time.monotonic() + 5
            while node_pids(index) and time.monotonic() < deadline:
                time.sleep(0.1)
        _ip("netns", "del", netns, check=False)
    links = _ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(VETH_PREFIX) and name[len(VETH_PREFIX) :].isdigit():
            _ip("link", "del", name, check=False)
    if f" {BRIDGE}:" in links:
        _ip("link", "del", BRIDGE, check=False)
    for path in (STATE / "nodes.json", STATE / "hosts", *STATE.glob("node*.ready")):
        path.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    usage = "usage: python -m tests.multinode.cluster up N | down | exec K COMMAND... | status"
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "up" and len(argv) == 2:
        why = why_unavailable()
        if why:
            print(f"cannot bring up nodes: {why}", file=sys.stderr)
            return 1
        for name, node in up(int(argv[1])).items():
            print(f"{name} {node['address']} init pid {node['pid']}")
        return 0
    if argv[0] == "down":
        down()
        return 0
    if argv[0] == "status":
        for name, node in nodes().items():
            print(f"{name} {node['address']} init pid {node['pid']} link bytes {link_bytes(node['index'])}")
        return 0
    if argv[0] == "exec" and len(argv) >= 3:
        index = int(argv[1]) if argv[1].isdigit() else argv[1]
        os.execvp("nsenter", exec_argv(index, argv[2:]))
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
