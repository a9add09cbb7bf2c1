"""What a sandbox causes is charged to that sandbox: the slirp4netns that
carries its egress runs in its cgroups with a bounded number of open files,
a restore's unpacker and the bytes it writes run in its cgroups, socket
buffers count against its memory limit (cgroup v1: the TCP kernel-memory
limit), and the unpacker reads only the compressions snapshots use."""

from __future__ import annotations

import gzip
import io
import lzma
import os
import secrets
import tarfile
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.lib.gateway import gateway_client, holder_pids

MEMORY_MB = 128


def cgroup_lines(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cgroup") as f:
        return f.read().splitlines()


def in_sandbox_groups(pid: int, group: str, sid: str) -> bool:
    """The hierarchies that limit a sandbox (pids, memory, freezer; the
    unified one on cgroup v2) place `pid` in the sandbox's group."""
    v1, unified = [], []
    for line in cgroup_lines(pid):
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            unified.append(path)
        elif set(controllers.split(",")) & {"pids", "memory", "freezer"}:
            v1.append(path)
    used = v1 or unified  # hybrid machines: the gateway uses the v1 hierarchies
    return bool(used) and all(p.startswith(f"/{group}/{sid}") for p in used)


def processes_named(name: bytes) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[0].endswith(name):
                        found.append(int(d))
            except OSError:
                pass
    return found


def parent_cmdline(pid: int) -> bytes:
    """The command line of `pid`'s parent (the helper names the sandbox)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            return f.read()
    except (OSError, ValueError):
        return b""


@pytest.fixture(scope="module")
def egress_client(gateway_secret):
    env = {"ALLOW_EGRESS": "true", "SANDBOX_MEMORY_MB": str(MEMORY_MB)}
    with gateway_client(env, secret=gateway_secret) as client:
        yield client


def test_slirp4netns_runs_in_the_sandboxs_cgroups_with_bounded_files(egress_client):
    sid = egress_client.launch(allow_egress=True, timeout=30).sandbox_id
    holder = holder_pids(egress_client.gw, sid)[sid]
    netns = f"/proc/{holder}/ns/net".encode()
    slirps = [p for p in processes_named(b"slirp4netns")
              if netns in open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")]
    assert len(slirps) == 1, slirps
    assert in_sandbox_groups(slirps[0], egress_client.gw.cgroup_group, sid), cgroup_lines(slirps[0])
    limits = Path(f"/proc/{slirps[0]}/limits").read_text()
    nofile = next(l for l in limits.splitlines() if l.startswith("Max open files")).split()
    assert int(nofile[3]) <= 1024 and int(nofile[4]) <= 1024, nofile


def test_socket_buffers_count_against_the_memory_limit(egress_client):
    sid = egress_client.launch().sandbox_id
    group = egress_client.gw.cgroup_group
    v1 = Path(f"/sys/fs/cgroup/memory/{group}/{sid}/memory.kmem.tcp.limit_in_bytes")
    if v1.exists():
        assert int(v1.read_text()) == MEMORY_MB << 20
    else:
        pytest.skip("cgroup v2 charges socket memory to memory.max by itself")


# Opens connection pairs over the sandbox's loopback and fills each one
# (the sender's queue and the receiver's) without ever reading: prints the
# bytes the kernel accepted in all.
SOCKET_HOG = r"""
import socket, sys, time
n = int(sys.argv[1])
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(n + 8)
port = srv.getsockname()[1]
pairs, total = [], 0
chunk = b"x" * (1 << 20)
deadline = time.monotonic() + 60
for _ in range(n):
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        s, _ = srv.accept()
    except OSError:
        break
    c.setblocking(False)
    pairs.append((c, s))
    while time.monotonic() < deadline:
        try:
            total += c.send(chunk)
        except OSError:
            break
print(total)
"""


def test_socket_buffers_cannot_hold_more_than_the_memory_limit(egress_client):
    """Without socket memory charged to the sandbox, 250 filled loopback
    connections queue gigabytes of kernel memory (up to ~10 MiB each) that
    no limit of the sandbox sees."""
    sid = egress_client.launch().sandbox_id
    try:
        res = egress_client.exec(sid, ["python3", "-c", SOCKET_HOG, "250"], timeout_seconds=120)
        assert res.code == 0 and res.out.strip().isdigit(), res.describe()
        queued = int(res.out)
        assert queued <= (MEMORY_MB << 20) * 5 // 4, f"{queued >> 20} MiB queued in socket buffers"
        assert queued > 0
    finally:
        egress_client.delete_many([sid], ignore_missing=True)


def test_the_unpacker_runs_confined_in_the_new_sandboxs_cgroups(egress_client):
    """During a slow restore, sandbox-unpack is a process of the sandbox's
    own cgroups, not of the gateway's, and it is confined."""
    sid = f"unpack-{secrets.token_hex(4)}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        data = b"x" * (1 << 20)
        info = tarfile.TarInfo("root/blob")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    release = threading.Event()

    def pieces():
        yield raw[:4096]
        release.wait(30)  # the unpacker is running, waiting for more
        yield raw[4096:]

    result = {}
    t = threading.Thread(target=lambda: result.update(r=egress_client.restore(sid, pieces())))
    t.start()
    try:
        deadline = time.monotonic() + 20
        seen = []
        while time.monotonic() < deadline and not seen:
            seen = [p for p in processes_named(b"sandbox-unpack") if sid.encode() in parent_cmdline(p)]
            time.sleep(0.05)
        assert seen, "no unpacker seen"
        assert any(in_sandbox_groups(p, egress_client.gw.cgroup_group, sid) for p in seen), \
            [cgroup_lines(p) for p in seen]
        # Confined before it reads the tar: no_new_privs, a seccomp filter,
        # and none of the capabilities it does not need.
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{seen[0]}/status").read_text().splitlines()
                      if ":\t" in line)
        assert status["NoNewPrivs"].strip() == "1", status
        assert status["Seccomp"].strip() == "2", status
        caps = int(status["CapEff"], 16)
        for cap in (2, 12, 13, 16, 17, 19):  # DAC_READ_SEARCH, NET_ADMIN, NET_RAW, SYS_MODULE, SYS_RAWIO, SYS_PTRACE
            assert not caps & (1 << cap), (cap, hex(caps))
    finally:
        release.set()
        t.join(60)
    assert result["r"].sandbox_id == sid


def test_the_unpacker_refuses_compressions_snapshots_do_not_use(egress_client):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("root/x")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    sid = f"xz-{secrets.token_hex(4)}"
    with pytest.raises(grpc.RpcError) as e:
        egress_client.restore(sid, [lzma.compress(buf.getvalue())])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    ok = f"gz-{secrets.token_hex(4)}"
    egress_client.restore(ok, [gzip.compress(buf.getvalue())])
    assert egress_client.sh_out(ok, "cat /root/x") == "x"


def directory_bomb(n: int = 250_000) -> bytes:
    """One long directory path repeated n times, gzip'd (~hundreds of KB)."""
    import gzip as gz
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("root/" + "/".join(["deep"] * 19))
        info.type = tarfile.DIRTYPE
        info.mtime = 1700000000
        for _ in range(n):
            tf.addfile(info)
    return gz.compress(raw.getvalue(), 9)


def test_a_directory_bomb_restores_within_the_sandboxs_limits(gateway_secret):
    from tests.lib.procs import RssSampler
    bomb = directory_bomb()
    assert len(bomb) < 2 << 20, len(bomb)
    env = {"SANDBOX_MEMORY_MB": str(MEMORY_MB), "SANDBOX_SNAPSHOT_MAX_ENTRIES": "1000000"}
    with gateway_client(env, secret=gateway_secret) as client:
        bystander = client.launch().sandbox_id
        sid = f"bomb-{secrets.token_hex(4)}"
        with RssSampler(client.gw) as rss:
            try:
                client.restore(sid, [bomb[i:i + 65536] for i in range(0, len(bomb), 65536)], timeout=300)
                restored = True
            except grpc.RpcError as e:
                restored = False
                assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    grpc.StatusCode.INTERNAL), e
        assert rss.peak_kib - rss.start_kib < 64 * 1024, (rss.start_kib, rss.peak_kib)
        if restored:
            assert client.sh_out(sid, "ls -d /root/deep && echo ok").endswith("ok\n")
        assert client.sh_out(bystander, "echo fine") == "fine\n"
