"""Egress: with ALLOW_EGRESS=true, a sandbox launched with allow_egress
reaches the network (here: a server in a network namespace the test
builds, behind a veth pair), but never the host's loopback or link-local
addresses; without either switch it reaches nothing."""

from __future__ import annotations

import os

import pytest

from tests.lib.client import SandboxClient
from tests.lib.gateway import gateway_client, holder_pids, start_gateway
from tests.lib.peers import answering_server, connect, running_netns
from tests.lib.procs import pid_alive, wait_until

@pytest.fixture(scope="module")
def netns():
    with running_netns() as n:
        yield n


@pytest.fixture(scope="module")
def host_loopback_server():
    """A server on the host's 127.0.0.1 that sandboxes must not reach."""
    with answering_server("127.0.0.1", b"host-loopback") as port:
        yield port


@pytest.fixture(scope="module")
def egress_gw(gateway_secret):
    with gateway_client({"ALLOW_EGRESS": "true"}, secret=gateway_secret, check_leftovers=True) as client:
        yield client


@pytest.fixture(scope="module")
def egress_box(egress_gw):
    info = egress_gw.launch(allow_egress=True, timeout=30)
    assert info.allow_egress
    return info.sandbox_id


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
    client = SandboxClient(gw)
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
    `holder` (their command line names its network namespace)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"slirp4netns") and f"/proc/{holder}/ns/net".encode() in args and pid_alive(int(d)):
            found.append(int(d))
    return found


def test_deleting_an_egress_sandbox_stops_its_network_helper(egress_gw):
    sid = egress_gw.launch(allow_egress=True, timeout=30).sandbox_id
    holder = holder_pids(egress_gw.gw, sid)[sid]
    assert len(slirp_of(holder)) == 1, "precondition: one slirp4netns for the sandbox"
    egress_gw.delete(sid)
    assert wait_until(lambda: slirp_of(holder) == [], timeout=10), slirp_of(holder)
