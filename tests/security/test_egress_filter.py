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
import os
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


# A DNS server for one name: answers A queries with ANSWER, anything else
# with no answer.
DNS_SERVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 53))
print("ready", flush=True)
while True:
    q, peer = s.recvfrom(4096)
    i = 12
    while q[i] != 0:
        i += q[i] + 1
    question = q[12:i + 5]
    qtype = int.from_bytes(q[i + 1:i + 3], "big")
    answer = (b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + bytes(int(x) for x in sys.argv[2].split("."))
              if qtype == 1 else b"")
    header = q[:2] + b"\x81\x80\x00\x01" + (b"\x00\x01" if answer else b"\x00\x00") + b"\x00\x00\x00\x00"
    s.sendto(header + question + answer, peer)
"""
ANSWER = "10.9.8.7"


@pytest.fixture(scope="module")
def world(gateway_secret, tmp_path_factory):
    """(client, netns): a gateway with egress inside a fresh network
    namespace that also holds a metadata-like server, and a DNS server on
    the gateway's own address there (its resolv.conf, in a mount namespace
    of its own, names it)."""
    if not Path("/sys/fs/cgroup/unified").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        pytest.skip("no cgroup v2 on this machine: the filter outside sandboxes needs it")
    with running_netns() as netns:
        ns = ["ip", "netns", "exec", netns.name]
        # On the namespace's loopback (this kernel may have no dummy
        # interfaces): an address of the gateway's own network namespace.
        run(ns + ["ip", "addr", "add", f"{METADATA}/32", "dev", "lo"])
        # Multicast leaves by the veth, as by a host's default route.
        run(ns + ["ip", "route", "add", "224.0.0.0/4", "dev", netns.ns_if])
        resolv = tmp_path_factory.mktemp("dns") / "resolv.conf"
        resolv.write_text(f"nameserver {netns.ns_ip}\n")
        env = gateway_env({"ALLOW_EGRESS": "true", "SANDBOX_LISTEN": f"{netns.ns_ip}:0"}, secret=gateway_secret)
        gw = Gateway(env, binary=Path(shutil.which("nsenter")),
                     args=[f"--net=/run/netns/{netns.name}", "--", "unshare", "-m", "--propagation", "private", "--",
                           "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$1"', str(resolv),
                           str(require_gateway_binary())])
        gw.host = netns.ns_ip
        dns = subprocess.Popen(["ip", "netns", "exec", netns.name, "/usr/bin/python3", "-c", DNS_SERVER, netns.ns_ip,
                                ANSWER], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        try:
            assert dns.stdout.readline().strip() == "ready"
            gw.wait_listening()
            with ns_server(netns, METADATA, 80, "metadata"), sandbox_client(gw) as client:
                yield client, netns
        finally:
            dns.kill()
            dns.wait(10)
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


def test_dns_through_the_filter_still_resolves(world):
    """The host's nameserver here is the gateway's own address, which the
    filter refuses for everything but DNS: names still resolve, through
    slirp4netns' forwarder, and its other ports stay shut."""
    client, netns = world
    sid = client.launch(allow_egress=True, timeout=30).sandbox_id
    strip_routes(holder_pids(client.gw, sid)[sid])
    res = client.py(sid, "import socket; print(socket.gethostbyname('service.test'))")
    assert res.out.strip() == ANSWER, res.describe()
    assert not connect(client, sid, netns.ns_ip, netns.port, timeout=3).startswith("OK")


# A UDP listener in the test's namespace (where slirp4netns sends from): on
# argv[2], joined to the multicast group argv[1] when it is one; prints
# "ready", then what arrives within 4 s, or "nothing".
UDP_LISTENER = r"""
import socket, struct, sys
group, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
if 224 <= int(group.split(".")[0]) <= 239:
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, struct.pack("4s4s", socket.inet_aton(group),
                                                                          socket.inet_aton("0.0.0.0")))
print("ready", flush=True)
s.settimeout(4)
try:
    print(s.recv(100).decode(), flush=True)
except OSError:
    print("nothing", flush=True)
"""


def sent_from_sandbox_arrives(client, netns, sid: str, dst: str, port: int) -> str:
    listener = subprocess.Popen(["ip", "netns", "exec", netns.name, "/usr/bin/python3", "-c", UDP_LISTENER,
                                 dst, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "ready"
        client.py(sid, "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                       "s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\n"
                       f"for _ in range(5):\n    try: s.sendto(b'leak', ('{dst}', {port}))\n"
                       "    except OSError: pass")
        return listener.stdout.readline().strip()
    finally:
        listener.kill()
        listener.wait(10)


def test_multicast_never_reaches_a_host_side_listener(world):
    """LLMNR's group (224.0.0.252:5355): slirp4netns would send it from the
    host's namespace, where the kernel loops it back to any local service
    joined to the group. (The libslirp of this image drops multicast itself;
    the filter is what holds where one does not:
    test_multicast_broadcast_and_reserved_destinations_are_refused_to_slirp4netns.)"""
    client, netns = world
    sid = client.launch(allow_egress=True, timeout=30).sandbox_id
    strip_routes(holder_pids(client.gw, sid)[sid])
    assert sent_from_sandbox_arrives(client, netns, sid, "224.0.0.252", 5355) == "nothing"


# Run inside the test's namespace, moved into the cgroup argv[1] (slirp4netns'
# filtered group): sends one datagram to each of argv[2:] (with
# SO_BROADCAST), printing the errno name each sendto failed with, or "sent".
FROM_SLIRPS_GROUP = r"""
import errno, os, socket, sys
with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
for dst in sys.argv[2:]:
    host, port = dst.split(":")
    try:
        s.sendto(b"leak", (host, int(port)))
        print("sent", flush=True)
    except OSError as e:
        print(errno.errorcode.get(e.errno, str(e.errno)), flush=True)
"""


def slirp_group(sid: str) -> str:
    """The cgroup-v2 directory slirp4netns of sandbox `sid` runs in."""
    for pid in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if pid.isdigit() and Path(f"/proc/{pid}/comm").read_text().strip() == "slirp4netns":
                for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                    if line.startswith("0::") and f"/{sid}" in line:
                        root = "/sys/fs/cgroup/unified" if Path("/sys/fs/cgroup/unified").is_dir() else "/sys/fs/cgroup"
                        return root + line[3:]
    raise AssertionError(f"no slirp4netns of {sid} in a cgroup-v2 group")


def test_multicast_broadcast_and_reserved_destinations_are_refused_to_slirp4netns(world):
    """Whatever slirp4netns would forward (another libslirp, a bug in it):
    from its filtered group, datagrams to multicast groups, limited
    broadcast, 240.0.0.0/4 and the broadcast address of the gateway's subnet
    are refused by the kernel (EPERM), and a listener on the host side gets
    none of them. A process of the test stands in for slirp4netns there."""
    client, netns = world
    sid = client.launch(allow_egress=True, timeout=30).sandbox_id
    group = slirp_group(sid)
    # nsenter, not `ip netns exec`, which mounts a /sys of its own (no cgroups).
    from_ns = ["nsenter", f"--net=/run/netns/{netns.name}", "--"]
    subnet_broadcast = netns.ns_ip.rsplit(".", 1)[0] + ".255"
    dsts = ["224.0.0.252:5355", "224.0.0.251:5353", "239.255.255.250:1900", "255.255.255.255:5355",
            f"{subnet_broadcast}:5355", "240.0.0.1:5355"]
    listener = subprocess.Popen(["ip", "netns", "exec", netns.name, "/usr/bin/python3", "-c", UDP_LISTENER,
                                 "224.0.0.252", "5355"], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "ready"
        out = run(from_ns + ["/usr/bin/python3", "-c", FROM_SLIRPS_GROUP, group]
                  + dsts).stdout.split()
        got = listener.stdout.readline().strip()
    finally:
        listener.kill()
        listener.wait(10)
    assert out == ["EPERM"] * len(dsts), list(zip(dsts, out))
    assert got == "nothing"
    # Ordinary destinations still pass the filter.
    assert run(from_ns + ["/usr/bin/python3", "-c", FROM_SLIRPS_GROUP, group,
                f"{netns.host_ip}:9"]).stdout.split() == ["sent"]
