"""What a sandbox is: background processes that outlive their exec, a
private writable overlay over a read-only image, and isolation from the host
and from other sandboxes (processes, mounts, files, network)."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil

import pytest

from tests.lib.client import new_id
from tests.lib.peers import answering_server, connect_argv


@pytest.fixture(scope="module")
def pair(sbx):
    """Two sandboxes, A and B, shared by the tests of this module. Tests
    use names of their own so they never see each other's files."""
    a, b = new_id("a"), new_id("b")
    sbx.launch(a)
    sbx.launch(b)
    return a, b


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# --- background processes ------------------------------------------------------

SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); c.sendall(sys.argv[2].encode()); c.close()
"""


def test_background_server_outlives_its_exec_and_serves_the_same_sandbox_only(sbx, pair):
    a, b = pair
    token = secrets.token_hex(8)
    started = sbx.exec(a, ["sh", "-c", 'nohup python3 -c "$0" 8000 "$1" >/dev/null 2>&1 &', SERVER, token],
                       timeout_seconds=20)
    assert started.code == 0, started.describe()
    # Readiness: retry inside the sandbox until the server answers.
    probe = ("for i in $(seq 100); do r=$(python3 -c \"$0\" 127.0.0.1 8000 2); "
             "case $r in OK*) echo $r; exit 0;; esac; sleep 0.1; done; echo $r; exit 1")
    got = sbx.exec(a, ["sh", "-c", probe, connect_argv("127.0.0.1", 8000)[2]], timeout_seconds=30)
    assert got.code == 0 and got.out.strip() == f"OK {token}", got.describe()
    # Still there for a later exec, and visible in the sandbox's ps.
    assert "python3" in sbx.exec(a, ["ps", "-e", "-o", "comm="]).out
    # Another sandbox has its own loopback: nothing listens there.
    other = sbx.exec(b, connect_argv("127.0.0.1", 8000))
    assert other.out.strip() == "ERR ECONNREFUSED", other.describe()
    sbx.ok(a, "pkill -f '[i]mport socket, sys' || true")


# --- the overlay -----------------------------------------------------------------

def test_file_written_in_a_sandbox_stays_in_that_sandbox(sbx, pair):
    a, b = pair
    name = f"/root/note-{secrets.token_hex(6)}.txt"
    content = secrets.token_hex(16)
    sbx.ok(a, f"echo {content} > {name}; echo tmp-{content} > /tmp/{os.path.basename(name)}")
    assert sbx.ok(a, f"cat {name}").out == f"{content}\n"
    assert sbx.ok(a, f"cat /tmp/{os.path.basename(name)}").out == f"tmp-{content}\n"
    res = sbx.sh(b, f"cat {name} /tmp/{os.path.basename(name)}")
    assert res.code != 0 and res.stdout == b"", res.describe()
    assert not os.path.exists(name), "the file reached the host's /root"
    assert not os.path.exists(f"/tmp/{os.path.basename(name)}"), "the file reached the host's /tmp"


@pytest.fixture
def host_file():
    """A file on the host, part of the image (SANDBOX_ROOTFS=/), created
    before the sandbox that changes it."""
    d = f"/usr/local/lib/sgwt-{secrets.token_hex(6)}"
    os.makedirs(d)
    path = f"{d}/data.txt"
    with open(path, "w") as f:
        f.write("original\n")
    try:
        yield path
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_changes_to_image_files_stay_in_the_sandbox(sbx, host_file):
    sid = new_id("ovl")
    before = {p: (sha256_of(p), os.stat(p).st_mode) for p in ("/usr/bin/yes", host_file)}
    hostname_before = sha256_of("/etc/hostname") if os.path.exists("/etc/hostname") else None
    sbx.launch(sid)
    try:
        sbx.ok(sid, f"rm -f /usr/bin/yes /etc/hostname; "
                    f"echo changed >> {host_file}; chmod 600 {host_file}; "
                    f"mkdir -p /usr/local/lib/x && echo inside > /usr/local/lib/x/new")
        # The changes are real inside...
        res = sbx.sh(sid, f"test -e /usr/bin/yes; echo $?; test -e /etc/hostname; echo $?; "
                          f"cat {host_file}; stat -c %a {host_file}; cat /usr/local/lib/x/new")
        assert res.out.split("\n") == ["1", "1", "original", "changed", "600", "inside", ""], res.describe()
        sbx.ok(sid, f"rm {host_file}")
        assert sbx.sh(sid, f"test -e {host_file}").code == 1
    finally:
        sbx.delete(sid)
    # ...and none reached the host.
    assert {p: (sha256_of(p), os.stat(p).st_mode) for p in before} == before
    if hostname_before is not None:
        assert sha256_of("/etc/hostname") == hostname_before
    assert not os.path.exists("/usr/local/lib/x/new")


def test_deleted_sandbox_changes_are_gone_from_a_new_sandbox_with_the_same_id(sbx):
    sid = new_id("reuse")
    sbx.launch(sid)
    sbx.ok(sid, "echo one > /root/state")
    sbx.delete(sid)
    sbx.launch(sid)
    try:
        assert sbx.sh(sid, "cat /root/state").code != 0
    finally:
        sbx.delete(sid)


# --- isolation from the host -----------------------------------------------------

def test_ps_shows_only_the_sandbox_processes(sbx, pair):
    a, _ = pair
    res = sbx.exec(a, ["ps", "-e", "-o", "pid=,comm=,args="])
    rows = [line.split(None, 2) for line in res.out.splitlines()]
    pids = {int(r[0]): r for r in rows}
    # pid 1 is the holder; the rest are this sandbox's (ps itself, maybe a
    # background server of another test of this module).
    assert pids[1][1] == "sandbox-helper", rows
    assert all(r[1] in ("sandbox-helper", "ps", "python3") for r in rows), rows
    assert not any("pytest" in r[-1] or "sandbox-gateway" in r[-1] for r in rows), rows
    assert max(pids) < 1000, rows


def test_host_processes_cannot_be_signalled(sbx, pair, gateway):
    a, _ = pair
    for pid in (gateway.pid, os.getpid()):
        res = sbx.sh(a, f"kill -0 {pid} 2>&1; echo rc=$?")
        assert "rc=0" not in res.out, (pid, res.describe())
    assert gateway.alive()


def test_mount_table_shows_no_host_mounts(sbx, pair, gateway):
    a, _ = pair
    res = sbx.exec(a, ["cat", "/proc/self/mountinfo"])
    mounts = [line.split() for line in res.out.splitlines()]
    points = [m[4] for m in mounts]
    root = [m for m in mounts if m[4] == "/"]
    assert len(root) == 1 and root[0][root[0].index("-") + 1] == "overlay", res.out
    allowed = ("/proc", "/dev")
    # The gateway's state directory, when the image shows it, is covered by
    # an empty read-only tmpfs (nothing of the host's behind it).
    masks = [m for m in mounts if m[4] == gateway.state_dir]
    assert all(m[m.index("-") + 1] == "tmpfs" and m[5].startswith("ro") for m in masks), res.out
    strays = [p for p in points
              if p not in ("/", gateway.state_dir) and not any(p == x or p.startswith(x + "/") for x in allowed)]
    assert strays == [], f"host mounts visible inside: {strays}\n{res.out}"
    assert "/sys" not in points
    assert not any(p.startswith(gateway.state_dir + "/") for p in points)
    assert sbx.exec(a, ["ls", "-A", "/sys"]).out == "", "/sys must be empty"


def test_another_sandbox_disk_is_not_reachable_through_the_state_directory(sbx, pair, gateway):
    a, b = pair
    name = f"secret-{secrets.token_hex(6)}"
    sbx.ok(b, f"echo s3cr3t > /tmp/{name}")
    # B's disk is mounted only in B's own mount namespace: not even the host
    # sees it under the state directory (the gateway holds a descriptor).
    upper = f"{gateway.state_dir}/sandboxes/{b}/disk/upper/tmp/{name}"
    assert not os.path.exists(upper), "the host sees B's upper layer in the state directory"
    res = sbx.sh(a, f"cat {upper}")
    assert res.code != 0 and b"s3cr3t" not in res.stdout, res.describe()


def test_gateway_port_is_not_reachable_from_inside(sbx, pair, gateway):
    a, _ = pair
    res = sbx.exec(a, connect_argv("127.0.0.1", gateway.port))
    assert res.out.strip() == "ERR ECONNREFUSED", res.describe()


@pytest.fixture
def host_server():
    """A TCP server on all the host's addresses, answering "host"."""
    with answering_server("0.0.0.0", b"host") as port:
        yield port


def host_addresses() -> list[str]:
    import subprocess
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


def test_without_egress_nothing_outside_is_reachable(sbx, pair, host_server):
    a, _ = pair
    targets = [(ip, host_server) for ip in host_addresses()] + [
        ("10.0.2.2", host_server), ("169.254.169.254", 80), ("8.8.8.8", 53), ("1.1.1.1", 443)]
    for host, port in targets:
        res = sbx.exec(a, connect_argv(host, port, timeout=2.0))
        assert res.out.startswith("ERR"), (host, port, res.describe())
    # Only the loopback interface exists.
    links = sbx.exec(a, ["ip", "-o", "link"]).out.splitlines()
    assert len(links) == 1 and ": lo:" in links[0], links


# --- isolation between sandboxes -------------------------------------------------

def test_sandboxes_do_not_see_each_other_processes(sbx, pair):
    a, b = pair
    marker = "987654.5"
    sbx.ok(a, f"nohup sleep {marker} >/dev/null 2>&1 &")
    try:
        assert marker in sbx.exec(a, ["ps", "-e", "-o", "args="]).out
        assert marker not in sbx.exec(b, ["ps", "-e", "-o", "args="]).out
        res = sbx.sh(b, "pkill -f '[9]87654.5'; echo rc=$?")
        assert "rc=1" in res.out, res.describe()  # nothing matched
        assert marker in sbx.exec(a, ["ps", "-e", "-o", "args="]).out
    finally:
        sbx.sh(a, "pkill -f '[9]87654.5'")


def test_sandboxes_have_their_own_hostname_ipc_and_tmp(sbx, pair):
    a, b = pair
    name = secrets.token_hex(6)
    sbx.ok(a, f"echo a > /tmp/{name}; echo a > /dev/shm/{name}")
    res = sbx.sh(b, f"ls /tmp/{name} /dev/shm/{name}")
    assert res.code != 0, res.describe()
    assert sbx.exec(a, ["hostname"]).code == 0
