"""The egress policy is enforced outside the sandbox: slirp4netns, which
makes every outside connection of an egress sandbox, runs under a filter in
the host's kernel (cgroup BPF) that refuses the host's own addresses,
loopback and link-local (the cloud metadata server). The routes inside the
sandbox's network namespace are only a first line: with them removed (as if
the sandbox had found a way around them), nothing more is reachable.

The gateway runs in a network namespace the test makes, holding
169.254.169.254 and a server listening there, so the metadata address
really answers from where slirp4netns connects."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.lib.client import sandbox_client
from tests.lib.gateway import Gateway, gateway_env, holder_pids, stop_checked
from tests.lib.peers import NS_SERVER, answering_server, connect, running_netns
from tests.lib.procs import require_gateway_binary

METADATA = "169.254.169.254"


def run(argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def ns_server(netns, host: str, port: int, token: str):
    """A TCP server inside the test's namespace answering `token`."""
    p = subprocess.Popen(["ip", "netns", "exec", netns.name, "/usr/bin/python3", "-c", NS_SERVER, host, str(port),
                          token], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.poll() is not None else ""
        yield
    finally:
        p.kill()
        p.wait(10)


@pytest.fixture(scope="module")
def world(gateway_secret):
    """(client, netns): a gateway with egress inside a fresh network
    namespace that also holds a metadata-like server."""
    if not Path("/sys/fs/cgroup/unified").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        pytest.skip("no cgroup v2 on this machine: the filter outside sandboxes needs it")
    with running_netns() as netns:
        ns = ["ip", "netns", "exec", netns.name]
        # On the namespace's loopback (this kernel may have no dummy
        # interfaces): an address of the gateway's own network namespace.
        run(ns + ["ip", "addr", "add", f"{METADATA}/32", "dev", "lo"])
        env = gateway_env({"ALLOW_EGRESS": "true", "SANDBOX_LISTEN": f"{netns.ns_ip}:0"}, secret=gateway_secret)
        gw = Gateway(env, binary=Path(shutil.which("nsenter")),
                     args=[f"--net=/run/netns/{netns.name}", "--", str(require_gateway_binary())])
        gw.host = netns.ns_ip
        try:
            gw.wait_listening()
            with ns_server(netns, METADATA, 80, "metadata"), sandbox_client(gw) as client:
                yield client, netns
        finally:
            stop_checked(gw)


def strip_routes(holder: int) -> None:
    """What the sandbox would do if it could: remove every route that keeps
    it from the host's and link-local addresses (from the host side)."""
    out = run(["nsenter", f"--net=/proc/{holder}/ns/net", "ip", "-4", "route", "show", "type", "unreachable"]).stdout
    for line in out.splitlines():
        dst = line.split()[1]
        run(["nsenter", f"--net=/proc/{holder}/ns/net", "ip", "route", "del", "unreachable", dst])
    left = run(["nsenter", f"--net=/proc/{holder}/ns/net", "ip", "-4", "route", "show", "type", "unreachable"]).stdout
    assert left.strip() == "", left


def test_metadata_and_host_addresses_stay_unreachable_without_the_sandboxs_routes(world):
    client, netns = world
    sid = client.launch(allow_egress=True, timeout=30).sandbox_id
    # The network works: a server on the other side of the veth answers.
    with answering_server(netns.host_ip, b"outside") as port:
        assert connect(client, sid, netns.host_ip, port) == "OK outside"
        holder = holder_pids(client.gw, sid)[sid]
        strip_routes(holder)
        # Still reachable: the filter refuses only what it must.
        assert connect(client, sid, netns.host_ip, port) == "OK outside"
    for host, port in ((METADATA, 80), (netns.ns_ip, netns.port), ("127.0.0.1", netns.port)):
        out = connect(client, sid, host, port, timeout=3)
        assert not out.startswith("OK"), (host, port, out)


def test_the_filter_holds_for_udp_too(world):
    client, netns = world
    sid = client.launch(allow_egress=True, timeout=30).sandbox_id
    strip_routes(holder_pids(client.gw, sid)[sid])
    # A UDP datagram to the metadata address: slirp4netns' sendto is refused,
    # so nothing arrives at a UDP listener there.
    listener = subprocess.Popen(
        ["ip", "netns", "exec", netns.name, "/usr/bin/python3", "-c",
         "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 9999));"
         " print('ready', flush=True); s.settimeout(4)\ntry:\n    print(s.recv(100).decode(), flush=True)\n"
         "except OSError:\n    print('nothing', flush=True)", METADATA],
        stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "ready"
        client.py(sid, f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                       f"for _ in range(5): s.sendto(b'leak', ('{METADATA}', 9999))")
        assert listener.stdout.readline().strip() == "nothing"
    finally:
        listener.kill()
        listener.wait(10)


def test_egress_launches_leave_the_hosts_mounts_alone(world):
    """slirp4netns' own sandbox detaches a copy of the mount tree: run
    without a private mount namespace around it, the detach propagated to
    the host's shared mounts and unmounted every `ip netns` name."""
    client, netns = world
    before = Path("/proc/self/mountinfo").read_text().count(f"/run/netns/{netns.name}")
    assert before >= 1
    sids = [client.launch(allow_egress=True, timeout=30).sandbox_id for _ in range(2)]
    client.delete_many(sids)
    assert Path("/proc/self/mountinfo").read_text().count(f"/run/netns/{netns.name}") == before
    assert subprocess.run(["ip", "netns", "exec", netns.name, "true"]).returncode == 0
