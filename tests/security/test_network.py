"""Network isolation: a sandbox has its own network namespace with only
`lo`; with egress (ALLOW_EGRESS=true + allow_egress) slirp4netns routes it
out, but never to the host itself (its loopback, its own addresses, the
gateway's port) nor to the link-local metadata range. Every target here is
on this machine: the host's loopback, or a network namespace the test
builds (tests/lib/peers.py's Netns, as in the egress integration tests)."""

from __future__ import annotations

import pytest

from tests.lib.gateway import gateway_client
from tests.lib.peers import answering_server, connect, running_netns


@pytest.fixture(scope="module")
def host_loopback_server():
    with answering_server("127.0.0.1", b"host-service") as port:
        yield port


@pytest.fixture(scope="module")
def netns():
    with running_netns() as n:
        yield n


@pytest.fixture(scope="module")
def host_veth_server(netns):
    """A host service on the host's own (non-loopback) address: the host
    end of the test's veth pair, like a service on the host's eth0."""
    with answering_server(netns.host_ip, b"host-service") as port:
        yield netns.host_ip, port


@pytest.fixture(scope="module")
def egress(gateway_secret):
    with gateway_client({"ALLOW_EGRESS": "true"}, secret=gateway_secret) as client:
        yield client, client.launch(allow_egress=True, timeout=30).sandbox_id


def assert_unreachable(result: str):
    assert not result.startswith("OK"), result


# --- without egress --------------------------------------------------------------

def test_offline_sandbox_has_only_loopback(sbx, box):
    res = sbx.exec(box, ["cat", "/proc/net/dev"])
    names = {line.split(":")[0].strip() for line in res.out.splitlines()[2:]}
    assert names == {"lo"}, res.describe()


def test_offline_sandbox_cannot_reach_the_gateway_port(sbx, box, gateway):
    # Technique: the gateway listens on the host's 127.0.0.1; try it through
    # the sandbox's loopback and slirp's host alias.
    for host in ("127.0.0.1", "10.0.2.2", "0.0.0.0"):
        assert_unreachable(connect(sbx, box, host, gateway.port))


def test_offline_sandbox_cannot_reach_a_host_loopback_server(sbx, box, host_loopback_server):
    for host in ("127.0.0.1", "10.0.2.2", "localhost"):
        assert_unreachable(connect(sbx, box, host, host_loopback_server))


def test_offline_sandbox_cannot_reach_the_metadata_server(sbx, box):
    assert_unreachable(connect(sbx, box, "169.254.169.254", 80, timeout=2))


def test_offline_sandbox_cannot_reach_a_host_address(sbx, box, netns, host_veth_server):
    # Technique: the host's end of a veth pair (10.231.x.1), and the server
    # in the netns behind it.
    host, port = host_veth_server
    assert_unreachable(connect(sbx, box, host, port, timeout=2))
    assert_unreachable(connect(sbx, box, netns.ns_ip, netns.port, timeout=2))


@pytest.mark.finding("F3")
def test_vsock_sockets_are_denied(sbx, box):
    # Technique: AF_VSOCK is not network-namespaced: a socket made in the
    # sandbox talks to the hypervisor host (CID 2) and other VMs' services
    # whatever the sandbox's netns says. Only creating a socket is tried
    # here (nothing is sent anywhere); it must be refused.
    res = sbx.exec(box, ["python3", "-c", r"""
import socket, errno
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    print("CREATED")
except OSError as e:
    print("denied", errno.errorcode.get(e.errno))
"""])
    assert res.code == 0 and "CREATED" not in res.out, res.describe()


# --- with egress -------------------------------------------------------------------

def test_egress_works_at_all(egress, netns):
    client, sid = egress
    assert connect(client, sid, netns.ns_ip, netns.port) == f"OK {netns.token}"


def test_egress_sandbox_cannot_reach_the_host_loopback(egress, host_loopback_server):
    client, sid = egress
    for host in ("127.0.0.1", "10.0.2.2", "127.0.0.2"):
        assert_unreachable(connect(client, sid, host, host_loopback_server))


def test_egress_sandbox_cannot_reach_its_gateway(egress):
    client, sid = egress
    for host in ("127.0.0.1", "10.0.2.2"):
        assert_unreachable(connect(client, sid, host, client.gw.port))


def test_egress_sandbox_cannot_reach_the_metadata_server(egress):
    client, sid = egress
    for host in ("169.254.169.254", "169.254.0.1"):
        assert_unreachable(connect(client, sid, host, 80, timeout=2))


def test_egress_sandbox_cannot_change_its_routes(egress):
    # Technique: drop the 169.254/16 unreachable route (needs CAP_NET_ADMIN).
    client, sid = egress
    res = client.exec(sid, ["sh", "-c", "ip route del unreachable 169.254.0.0/16 && echo DELETED; "
                                        "ip route add 169.254.169.254/32 dev tap0 && echo ADDED; true"])
    assert "DELETED" not in res.out and "ADDED" not in res.out, res.describe()


@pytest.mark.finding("F4")
def test_egress_sandbox_cannot_reach_host_services_on_non_loopback_addresses(egress, host_veth_server):
    # Technique: slirp4netns opens the sandbox's connections from the host's
    # network namespace; --disable-host-loopback only refuses 127.0.0.0/8,
    # so any address of the host itself (its eth0, a bridge, here the host
    # end of a veth pair) reaches host services, e.g. a gateway listening on
    # 0.0.0.0.
    client, sid = egress
    host, port = host_veth_server
    assert_unreachable(connect(client, sid, host, port))
