"""Egress: with ALLOW_EGRESS=true, a sandbox launched with allow_egress
reaches the network (here: a server in a network namespace the test
builds, behind a veth pair), but never the host's loopback or link-local
addresses; without either switch it reaches nothing."""

from __future__ import annotations

import os
import random
import secrets
import socket
import subprocess
import time

import pytest

from gateway_fixture import answering_server, start_gateway
from test_runtime_common import Sandboxes, connect_argv, holder_pids, pid_alive, run, wait_for

NS_SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[3].encode()); c.close()
"""


class Netns:
    """A network namespace with a veth pair to the host and a TCP server."""

    def __init__(self):
        used = run(["ip", "-4", "-o", "addr", "show"]).stdout
        for _ in range(50):
            self.x = random.randint(1, 254)
            if f"10.231.{self.x}." not in used:
                break
        tag = secrets.token_hex(3)
        self.name = f"sgwt-{tag}"
        self.host_if, self.ns_if = f"sgwt{tag}h", f"sgwt{tag}n"
        self.host_ip, self.ns_ip = f"10.231.{self.x}.1", f"10.231.{self.x}.2"
        self.port = 18000 + random.randint(0, 999)
        self.token = "hello-" + secrets.token_hex(4)
        self.server = None

    def setup(self):
        ns = ["ip", "netns", "exec", self.name]
        run(["ip", "netns", "add", self.name])
        run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if])
        run(["ip", "link", "set", self.ns_if, "netns", self.name])
        run(["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if])
        run(["ip", "link", "set", self.host_if, "up"])
        run(ns + ["ip", "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if])
        run(ns + ["ip", "link", "set", self.ns_if, "up"])
        run(ns + ["ip", "link", "set", "lo", "up"])
        self.server = subprocess.Popen(ns + ["/usr/bin/python3", "-c", NS_SERVER, self.ns_ip, str(self.port),
                                             self.token], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True)
        line = self.server.stdout.readline()
        assert line.strip() == "ready", (line, self.server.stderr.read() if self.server.poll() else "")
        # The host reaches it (so a failure below is the sandbox's).
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((self.ns_ip, self.port), timeout=2) as c:
                    assert c.recv(100).decode() == self.token
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def teardown(self):
        if self.server is not None:
            self.server.kill()
            self.server.wait(10)
        run(["ip", "netns", "del", self.name], check=False)
        run(["ip", "link", "del", self.host_if], check=False)


@pytest.fixture(scope="module")
def netns():
    n = Netns()
    try:
        n.setup()
        yield n
    finally:
        n.teardown()
    assert n.name not in run(["ip", "netns", "list"]).stdout


@pytest.fixture(scope="module")
def host_loopback_server():
    """A server on the host's 127.0.0.1 that sandboxes must not reach."""
    with answering_server("127.0.0.1", b"host-loopback") as port:
        yield port


@pytest.fixture(scope="module")
def egress_gw(gateway_secret):
    gw = start_gateway({"ALLOW_EGRESS": "true"}, secret=gateway_secret)
    client = Sandboxes(gw)
    try:
        yield client
    finally:
        client.cleanup()
        assert gw.stop() == 0, gw.describe()
        assert gw.leftovers() == []


@pytest.fixture(scope="module")
def egress_box(egress_gw):
    info = egress_gw.launch(allow_egress=True, timeout=30)
    assert info.allow_egress
    return info.sandbox_id


def connect(client, sid, host, port, timeout=3.0) -> str:
    res = client.exec(sid, connect_argv(host, port, timeout), timeout_seconds=30)
    assert res.code == 0, res.describe()
    return res.out.strip()


def test_egress_sandbox_reaches_the_network(egress_gw, egress_box, netns):
    assert connect(egress_gw, egress_box, netns.ns_ip, netns.port) == f"OK {netns.token}"


def test_egress_sandbox_cannot_reach_the_metadata_server(egress_gw, egress_box):
    out = connect(egress_gw, egress_box, "169.254.169.254", 80, timeout=3)
    assert out.startswith("ERR"), out
    routes = egress_gw.exec(egress_box, ["ip", "route", "show", "table", "all"]).out
    assert "169.254.0.0/16" in routes, routes


def test_egress_sandbox_cannot_reach_the_host_loopback(egress_gw, egress_box, host_loopback_server):
    port = host_loopback_server
    for host in ("10.0.2.2", "127.0.0.1"):
        out = connect(egress_gw, egress_box, host, port)
        assert out.startswith("ERR"), (host, out)
    # Nor the gateway itself.
    for host in ("10.0.2.2", "127.0.0.1"):
        out = connect(egress_gw, egress_box, host, egress_gw.gw.port)
        assert out.startswith("ERR"), (host, out)


def test_sandbox_without_allow_egress_on_an_egress_gateway_is_offline(egress_gw, netns):
    info = egress_gw.launch(allow_egress=False)
    assert not info.allow_egress
    out = connect(egress_gw, info.sandbox_id, netns.ns_ip, netns.port)
    assert out.startswith("ERR"), out
    links = egress_gw.exec(info.sandbox_id, ["ip", "-o", "link"]).out.splitlines()
    assert len(links) == 1 and ": lo:" in links[0], links


def test_gateway_without_allow_egress_ignores_the_request(gateway_secret, netns):
    gw = start_gateway({"ALLOW_EGRESS": None}, secret=gateway_secret)
    client = Sandboxes(gw)
    try:
        info = client.launch(allow_egress=True)
        assert not info.allow_egress
        assert not client.get(info.sandbox_id).allow_egress
        out = connect(client, info.sandbox_id, netns.ns_ip, netns.port)
        assert out.startswith("ERR"), out
    finally:
        client.cleanup()
        assert gw.stop() == 0, gw.describe()


def slirp_of(holder: int) -> list[int]:
    """Pids of slirp4netns processes serving the sandbox whose holder is
    `holder` (their command line names it)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"slirp4netns") and str(holder).encode() in args and pid_alive(int(d)):
            found.append(int(d))
    return found


def test_deleting_an_egress_sandbox_stops_its_network_helper(egress_gw):
    sid = egress_gw.launch(allow_egress=True, timeout=30).sandbox_id
    holder = holder_pids(egress_gw.gw)[sid]
    assert len(slirp_of(holder)) == 1, "precondition: one slirp4netns for the sandbox"
    egress_gw.delete(sid)
    assert wait_for(lambda: slirp_of(holder) == [], timeout=10), slirp_of(holder)
