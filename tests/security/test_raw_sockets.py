"""Raw and packet sockets: a sandbox cannot build its own frames or IP
packets (no CAP_NET_RAW, and seccomp refuses AF_PACKET and SOCK_RAW inet
sockets), with or without egress — hand-built frames on tap0 would
otherwise bypass every filter that works on connections. Netlink's
SOCK_RAW (ip(8)) keeps working."""

from __future__ import annotations

import pytest

from tests.lib.gateway import gateway_client
from tests.lib.security import py

PROBE = r"""
import errno, socket
def attempt(family, kind, proto):
    try:
        socket.socket(family, kind, proto).close()
        return "OPEN"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
print(attempt(socket.AF_PACKET, socket.SOCK_RAW, 0x0300))
print(attempt(socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300))
print(attempt(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
print(attempt(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.IPPROTO_ICMP))
print(attempt(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW))
print(attempt(socket.AF_NETLINK, socket.SOCK_RAW, 0))
"""


def probe(sbx, sid):
    res = py(sbx, sid, PROBE)
    assert res.code == 0, res.describe()
    return res.out.split()


def check(results):
    *raw, netlink = results
    assert all(r in ("EPERM", "EACCES") for r in raw), results
    assert netlink == "OPEN", results


def test_raw_and_packet_sockets_are_denied_without_egress(sbx, box):
    check(probe(sbx, box))


def test_raw_and_packet_sockets_are_denied_with_egress(gateway_secret):
    with gateway_client({"ALLOW_EGRESS": "true"}, secret=gateway_secret) as client:
        sid = client.launch(allow_egress=True, timeout=30).sandbox_id
        check(probe(client, sid))


def test_root_inside_has_no_cap_net_raw(sbx, box):
    res = py(sbx, box, "print(open('/proc/self/status').read())")
    caps = {line.split(":")[0]: int(line.split()[1], 16) for line in res.out.splitlines() if line.startswith("Cap")}
    CAP_NET_RAW = 13
    for kind in ("CapEff", "CapPrm", "CapBnd"):
        assert not caps[kind] & (1 << CAP_NET_RAW), (kind, hex(caps[kind]))


@pytest.mark.parametrize("argv", [["ip", "addr"], ["ip", "route"]])
def test_reading_the_network_configuration_still_works(sbx, box, argv):
    res = sbx.exec(box, argv)
    if res.code == 127:
        pytest.skip("ip(8) is not in the image")
    assert res.code == 0, res.describe()
