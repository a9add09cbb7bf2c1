"""Sandbox A against sandbox B on the same gateway: files, persisted
snapshots, processes, IPC, and B's identity."""

from __future__ import annotations

import secrets

import pytest

from tests.lib.client import SandboxClient
from tests.lib.gateway import cgroup_pids
from tests.lib.procs import pid_alive
from tests.lib.security import assert_works, py, sh


@pytest.fixture(scope="module")
def pair(sbx):
    a, b = sbx.launch().sandbox_id, sbx.launch().sandbox_id
    return a, b


@pytest.fixture(scope="module")
def b_secret(sbx, pair):
    _, b = pair
    token = "B-SECRET-" + secrets.token_hex(12)
    sbx.ok(b, f"echo {token} > /root/b-secret.txt; echo {token} > /tmp/b-secret.txt")
    return token


@pytest.mark.finding("F1")
def test_a_cannot_read_bs_persisted_snapshot(gateway, sbx, pair, b_secret):
    # Technique: the local snapshot store lives in the gateway's state
    # directory ($SANDBOX_STATE_DIR/snapshots, default /var/lib/sandbox-
    # gateway) on the host's root filesystem, which is every sandbox's lower
    # layer (SANDBOX_ROOTFS=/): persist B, then grep the store from A.
    a, b = pair
    snap = SandboxClient(gateway)
    done = snap.persist(b)[-1]
    assert done.done, done
    # (Overlayfs may show a lower file written after the mount only after a
    # moment: retry for a few seconds.)
    res = sh(sbx, a, f"for i in $(seq 50); do "
                     f"grep -rao {b_secret} {gateway.state_dir} /var/lib/sandbox-gateway 2>/dev/null && break; "
                     f"sleep 0.1; done; true")
    assert b_secret not in res.out, f"A read B's snapshot\n{res.describe()}"


@pytest.mark.finding("F1")
def test_a_cannot_list_other_sandboxes_ids(gateway, sbx, pair):
    # Technique: list the gateway's state directory through the lower layer
    # (one directory per sandbox, named by its id), and every place A could
    # learn ids from: its own /proc, mountinfo, hostname, cgroup paths.
    a, b = pair
    res = sh(sbx, a, f"ls -R {gateway.state_dir} 2>/dev/null | head -100; ls /var/lib/sandbox-gateway/sandboxes 2>/dev/null; "
                     "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '; cat /proc/self/mountinfo /proc/self/cgroup; "
                     "hostname; cat /etc/hostname")
    assert b not in res.out, f"A learned B's id\n{res.describe()}"


@pytest.mark.finding("F5")
def test_a_does_not_learn_host_paths_or_its_own_id(gateway, sbx, pair):
    # Technique: /proc/self/mountinfo shows the overlay's upperdir/workdir
    # (host paths with the sandbox id), and /proc/1/cmdline (world-readable)
    # shows the holder's arguments: id, state directory, cgroup group, limits.
    # The gateway's state directory, when the image contains it, is covered
    # by an empty read-only mount: its path shows in mountinfo, nothing more.
    a, _ = pair
    res = sh(sbx, a, "cat /proc/self/mountinfo; tr '\\0' ' ' < /proc/1/cmdline")
    for leak in (a, f"{gateway.state_dir}/sandboxes", gateway.cgroup_group):
        assert leak not in res.out, f"{leak!r} is visible inside the sandbox\n{res.describe()}"
    listing = sh(sbx, a, f"ls -A {gateway.state_dir} 2>&1; true")
    assert listing.out.strip() == "", listing.describe()


def test_a_cannot_read_bs_files_through_any_path(gateway, sbx, pair, b_secret):
    # Technique: B's upper layer is a tmpfs mounted on the host below the
    # state directory; A sees only the empty mount point through the lower
    # layer. Also /proc/*/root (B's processes are not in A's pid namespace).
    a, b = pair
    res = sh(sbx, a, f"""
cat /root/b-secret.txt /tmp/b-secret.txt 2>/dev/null
grep -rs {b_secret} {gateway.state_dir}/sandboxes 2>/dev/null
for p in /proc/[0-9]*; do cat $p/root/root/b-secret.txt $p/root/tmp/b-secret.txt 2>/dev/null; done
true""")
    assert b_secret not in res.out, res.describe()


def test_a_cannot_see_or_signal_bs_processes(gateway, sbx, pair):
    a, b = pair
    sbx.ok(b, "nohup sleep 1000 >/dev/null 2>&1 &")
    host_pids = cgroup_pids(gateway, b)
    assert host_pids, "no processes found in B's cgroup"
    a_sees = sh(sbx, a, "ls /proc | grep -c '^[0-9]'")
    assert int(a_sees.out) < 10, a_sees.describe()
    # Technique: B's host pids are numbers A can guess; kill them all.
    pids = " ".join(str(p) for p in sorted(host_pids))
    sh(sbx, a, f"kill -9 {pids} 2>/dev/null; kill -9 -1 2>/dev/null; true")
    assert all(pid_alive(p) for p in host_pids), "A killed one of B's processes"
    assert "sleep 1000" in sbx.exec(b, ["ps", "-eo", "args"]).out
    assert_works(sbx, b)


def test_a_cannot_reach_bs_ipc(sbx, pair):
    # Technique: an abstract unix socket (per network namespace), a SysV
    # shared memory segment (per IPC namespace) and /dev/shm (per sandbox).
    a, b = pair
    key = secrets.randbelow(1 << 30) + 1
    sbx.ok(b, "nohup python3 -c 'import socket,time; s=socket.socket(socket.AF_UNIX); s.bind(\"\\0sgw-sec\"); "
              "s.listen(1); time.sleep(600)' >/dev/null 2>&1 & "
              f"echo shm-b > /dev/shm/b-file; "
              f"python3 -c 'import ctypes; l=ctypes.CDLL(None); print(l.shmget({key}, 4096, 0o1666))'; sleep 0.5")
    res = py(sbx, a, r"""
import ctypes, os, socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0sgw-sec"); print("CONNECTED abstract socket")
except OSError as e:
    print("no abstract:", e.strerror)
libc = ctypes.CDLL(None)
print("shmget", "FOUND" if libc.shmget(%d, 0, 0) >= 0 else "none")
print("shm files", os.listdir("/dev/shm"))
""" % key)
    assert "CONNECTED" not in res.out and "FOUND" not in res.out and "b-file" not in res.out, res.describe()
