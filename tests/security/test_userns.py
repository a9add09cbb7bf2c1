"""User namespaces: each sandbox runs in a user namespace of its own, its ids
0..65535 mapped onto a host range no other live sandbox has. Root inside is
still root to the programs it runs (it owns the image's files, writes /etc,
chowns), but on the host it is an unprivileged uid, and so is everything it
starts, including the unpacker of its restores. Snapshots carry the owners
as seen inside."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import threading
import time
from pathlib import Path

from tests.lib.client import new_id, pb
from tests.lib.gateway import cgroup_pids, free_uid_block, gateway_client, gateway_env, holder_pids
from tests.lib.procs import require_gateway_binary, run_to_completion
from tests.lib.security import sh
from tests.lib.snapshots import chunks_of

RANGE = 65536


def host_ids(pid: int) -> tuple[list[int], list[int]]:
    """(uids, gids) of a host pid: real, effective, saved, filesystem."""
    uids = gids = []
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                uids = [int(x) for x in line.split()[1:]]
            elif line.startswith("Gid:"):
                gids = [int(x) for x in line.split()[1:]]
    return uids, gids


def uid_map(sbx, sid: str) -> tuple[int, int, int]:
    inside, outside, count = (int(x) for x in sbx.sh_out(sid, "cat /proc/self/uid_map").split())
    return inside, outside, count


def sandbox_base(sbx, sid: str) -> int:
    inside, outside, count = uid_map(sbx, sid)
    assert (inside, count) == (0, RANGE), (inside, outside, count)
    return outside


def assert_all_in_range(gateway, sid: str, base: int) -> None:
    pids = cgroup_pids(gateway, sid)
    assert pids, "the sandbox has processes"
    for pid in pids:
        try:
            uids, gids = host_ids(pid)
        except OSError:
            continue  # ended meanwhile
        for i in uids + gids:
            assert base <= i < base + RANGE, (pid, uids, gids, base)


def test_the_uid_map_inside_is_not_the_identity(sbx, box):
    inside, outside, count = uid_map(sbx, box)
    assert inside == 0 and count == RANGE and outside >= 1, (inside, outside, count)
    gmap = sbx.sh_out(box, "cat /proc/self/gid_map").split()
    assert [int(x) for x in gmap] == [0, outside, RANGE], gmap


def test_every_process_of_a_sandbox_is_a_host_uid_of_its_range(sbx, gateway):
    a, b = sbx.launch().sandbox_id, sbx.launch().sandbox_id
    try:
        for sid in (a, b):
            sbx.ok(sid, "nohup sleep 300 >/dev/null 2>&1 &")
        base_a, base_b = sandbox_base(sbx, a), sandbox_base(sbx, b)
        assert abs(base_a - base_b) >= RANGE, (base_a, base_b)
        assert_all_in_range(gateway, a, base_a)
        assert_all_in_range(gateway, b, base_b)
    finally:
        sbx.delete_many([a, b], ignore_missing=True)


def test_root_inside_owns_the_image_and_its_own_files(sbx, box):
    out = sbx.sh_out(box, "id -u; id -g; stat -c '%u:%g' /etc/passwd /usr/bin / /root;"
                          " echo renamed > /etc/hostname && cat /etc/hostname;"
                          " touch /tmp/u1000 && chown 1000:1000 /tmp/u1000 && stat -c '%u:%g' /tmp/u1000;"
                          " su -s /bin/sh nobody -c 'id -u' 2>/dev/null || true")
    lines = out.split("\n")
    assert lines[:8] == ["0", "0", "0:0", "0:0", "0:0", "0:0", "renamed", "1000:1000"], out
    if len(lines) > 8 and lines[8]:
        assert lines[8] == "65534", out


def test_owners_outside_the_range_cannot_be_made(sbx, box):
    res = sh(sbx, box, "touch /tmp/big && chown 70000 /tmp/big")
    assert res.code != 0, res.describe()
    assert "Invalid argument" in res.err, res.describe()


def test_files_a_sandbox_writes_are_its_host_range_on_the_host(sbx, gateway, box):
    sbx.ok(box, "echo x > /tmp/mine; chown 7:7 /tmp/mine; echo y > /tmp/root-owned")
    base = sandbox_base(sbx, box)
    # Through the holder's root (the overlay) as the host sees it.
    tmp = Path(f"/proc/{holder_pids(gateway, box)[box]}/root/tmp")
    st_mine, st_root = os.stat(tmp / "mine"), os.stat(tmp / "root-owned")
    assert (st_mine.st_uid, st_mine.st_gid) == (base + 7, base + 7)
    assert (st_root.st_uid, st_root.st_gid) == (base, base)


def test_a_snapshot_lists_owners_as_seen_inside_and_restores_elsewhere(sbx):
    sid = sbx.launch().sandbox_id
    sbx.ok(sid, "mkdir -p /srv/app && echo hi > /srv/app/a && touch /srv/app/b && chown 1000:1001 /srv/app/b"
                " && rm /etc/hostname")
    data = sbx.export(sid).data
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        owners = {m.name: (m.uid, m.gid) for m in tf.getmembers()}
    assert owners["srv/app/a"] == (0, 0), owners
    assert owners["srv/app/b"] == (1000, 1001), owners
    assert owners["srv"] == (0, 0), owners
    assert all(u < RANGE and g < RANGE for u, g in owners.values()), owners
    # Restored into a sandbox with another host range: the same owners inside.
    other = new_id("moved")
    sbx.restore(other, chunks_of(data))
    try:
        assert sandbox_base(sbx, other) != sandbox_base(sbx, sid)
        out = sbx.sh_out(other, "stat -c '%u:%g' /srv/app/a /srv/app/b; cat /srv/app/a;"
                                " test -e /etc/hostname && echo there || echo gone")
        assert out == "0:0\n1000:1001\nhi\ngone\n", out
    finally:
        sbx.delete_many([sid, other], ignore_missing=True)


def test_a_round1_snapshot_restores_with_its_owners_inside(sbx):
    data = (Path(__file__).resolve().parents[1] / "snapshots" / "round1" / "basic.tar").read_bytes()
    sid = new_id("round1")
    sbx.restore(sid, chunks_of(data))
    try:
        out = sbx.sh_out(sid, "stat -c '%u:%g' /root/proj/src/main.py /root/proj/src; ls /etc/apt")
        assert out == "0:0\n1000:1000\nonly\n", out
    finally:
        sbx.delete_many([sid], ignore_missing=True)


def _unpacker_pids(gateway, sid: str) -> list[int]:
    """sandbox-unpack processes restoring `sid` (they run in its cgroup)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if argv0 == b"sandbox-unpack" and int(entry.name) in cgroup_pids(gateway, sid):
            pids.append(int(entry.name))
    return pids


def test_the_unpacker_runs_as_the_sandboxes_root_with_its_filter(sbx, gateway):
    """A tar that made libarchive misbehave would hold what the unpacker
    holds: a host uid of the sandbox's range, no_new_privs, seccomp."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(50):
            info = tarfile.TarInfo(f"srv/f{i}")
            info.size = 1000
            tf.addfile(info, io.BytesIO(b"x" * 1000))
    data = buf.getvalue()
    half = len(data) // 2
    release = threading.Event()

    def pieces():
        yield data[:half]
        release.wait(30)  # the restore stalls mid-tar: the unpacker waits
        yield data[half:]

    sid = new_id("slow")
    errors: list[BaseException] = []

    def run():
        try:
            sbx.restore(sid, pieces())
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 20
        pids: list[int] = []
        while not pids and time.monotonic() < deadline:
            pids = _unpacker_pids(gateway, sid)
            time.sleep(0.05)
        assert pids, "no sandbox-unpack process during the restore"
        status = Path(f"/proc/{pids[0]}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids = [int(x) for x in fields["Uid"].split()]
        assert all(u >= 1 for u in uids), uids
        assert fields["NoNewPrivs"].strip() == "1", status
        assert fields["Seccomp"].strip() == "2", status
        assert Path(f"/proc/{pids[0]}/uid_map").read_text().split()[:2] == ["0", str(uids[0])]
    finally:
        release.set()
        t.join(60)
    assert not errors, errors
    try:
        base = sandbox_base(sbx, sid)
        assert uids == [base] * 4, (uids, base)
        assert sbx.sh_out(sid, "stat -c '%u' /srv/f0; wc -c < /srv/f49") == "0\n1000\n"
    finally:
        sbx.delete_many([sid], ignore_missing=True)


def test_ranges_are_reused_only_once_their_sandbox_is_gone(gateway_secret):
    """A pool of exactly two ranges: two live sandboxes have different ones;
    a third gets one only after a delete, and then the freed one."""
    base = free_uid_block(2)
    with gateway_client({"SANDBOX_UID_BASE": str(base), "SANDBOX_UID_SLOTS": "2", "SANDBOX_MAX": "2"},
                        secret=gateway_secret) as sbx:
        a, b = sbx.launch().sandbox_id, sbx.launch().sandbox_id
        base_a, base_b = sandbox_base(sbx, a), sandbox_base(sbx, b)
        assert {base_a, base_b} == {base, base + RANGE}
        sbx.delete(a)
        c = sbx.launch().sandbox_id
        assert sandbox_base(sbx, c) == base_a
        assert sandbox_base(sbx, b) == base_b


def test_a_pool_too_small_for_sandbox_max_is_refused_at_start():
    env = gateway_env({"SANDBOX_UID_BASE": str(4294967295 - 2 * RANGE), "SANDBOX_MAX": "3"}, secret="s")
    result = run_to_completion([require_gateway_binary()], env, timeout=20)
    assert result.returncode != 0, result.stderr
    assert "SANDBOX_UID_BASE" in result.stderr and "SANDBOX_MAX" in result.stderr, result.stderr


def test_without_support_the_gateway_refuses_to_start_and_names_the_opt_out():
    # procfs cannot be idmapped: a volume of it with an owner (an idmapped
    # mount) cannot be given to a sandbox in a user namespace.
    env = gateway_env({"SANDBOX_VOLUME_MOUNTS": "/proc:/hostproc:ro:uid=4242"}, secret="s")
    try:
        result = run_to_completion([require_gateway_binary()], env, timeout=30)
        assert result.returncode != 0, result.stderr
        assert "SANDBOX_USERNS" in result.stderr, result.stderr
        assert not (Path(env["SANDBOX_STATE_DIR"]) / "probe").exists(), "the probe left its directory"
    finally:
        shutil.rmtree(env["SANDBOX_STATE_DIR"], ignore_errors=True)


def test_the_opt_out_runs_round1_isolation_and_says_so(gateway_secret):
    with gateway_client({"SANDBOX_USERNS": "false"}, secret=gateway_secret) as sbx:
        st = sbx.stub.Status(pb.StatusRequest(), metadata=sbx.md, timeout=10)
        assert not st.user_namespaces
        assert any("SANDBOX_USERNS" in w for w in st.warnings), st
        sid = sbx.launch().sandbox_id
        assert uid_map(sbx, sid) == (0, 0, 4294967295)
    with gateway_client(secret=gateway_secret) as sbx:
        st = sbx.stub.Status(pb.StatusRequest(), metadata=sbx.md, timeout=10)
        assert st.user_namespaces and not st.warnings, st


def test_volumes_keep_the_sandbox_s_own_ids_or_their_owner_s(tmp_path, gateway_secret):
    """A volume is never host root's to a sandbox: without an owner it is
    not idmapped (host root's files are nobody's inside, what the sandbox
    writes is its own host ids'); with `uid=N` sandbox root is host id N
    there, and only N."""
    vol = tmp_path / "vol"
    vol.mkdir()
    vol.chmod(0o1777)
    (vol / "by-root").write_text("r")
    (vol / "by-1000").write_text("u")
    os.chown(vol / "by-1000", 1000, 1000)
    with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{vol}:/data"}, secret=gateway_secret) as sbx:
        sid = sbx.launch().sandbox_id
        base = sandbox_base(sbx, sid)
        out = sbx.sh_out(sid, "stat -c '%u:%g' /data/by-root /data/by-1000; echo new > /data/made; id -u")
        assert out == "65534:65534\n65534:65534\n0\n", out
        assert (os.stat(vol / "made").st_uid, os.stat(vol / "made").st_gid) == (base, base)
    os.chown(vol, 1000, 1000)  # an owned volume's directory is its owner's
    with gateway_client({"SANDBOX_VOLUME_MOUNTS": f"{vol}:/data:uid=1000"}, secret=gateway_secret) as sbx:
        sid = sbx.launch().sandbox_id
        out = sbx.sh_out(sid, "stat -c '%u:%g' /data/by-root /data/by-1000; echo more >> /data/by-1000; "
                              "echo new > /data/made2; cat /data/by-1000")
        assert out == "65534:65534\n0:0\nu\nmore\n" or out == "65534:65534\n0:0\numore\n", out
        assert (os.stat(vol / "made2").st_uid, os.stat(vol / "made2").st_gid) == (1000, 1000)


INOTIFY_HOG = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
with open("/tmp/hog.count", "w") as f:
    f.write(str(len(fds)))
time.sleep(120)
"""


def test_per_user_kernel_limits_are_per_sandbox(sbx):
    """Inotify instances are counted per user, and charged to a user
    namespace's owner in the parent namespace too: one sandbox holding all
    it may must leave the host's root and another sandbox theirs."""
    import ctypes
    a, b = sbx.launch().sandbox_id, sbx.launch().sandbox_id
    try:
        sbx.ok(a, "cat > /tmp/hog.py && (nohup python3 /tmp/hog.py >/dev/null 2>&1 &)", stdin=INOTIFY_HOG.encode())
        deadline = time.monotonic() + 20
        count = ""
        while not count and time.monotonic() < deadline:
            count = sbx.sh_out(a, "cat /tmp/hog.count 2>/dev/null || true").strip()
            time.sleep(0.1)
        assert count and int(count) >= 1, count
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0)
        assert fd >= 0, f"the host's root cannot make an inotify instance: errno {ctypes.get_errno()}"
        os.close(fd)
        res = sbx.py(b, "import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)")
        assert res.out.strip() == "True", res.describe()
    finally:
        sbx.delete_many([a, b], ignore_missing=True)


def test_root_inside_still_binds_low_ports(sbx, box):
    res = sbx.py(box, "import socket; s = socket.socket(); s.bind(('127.0.0.1', 80)); s.listen(); print('bound')")
    assert res.out.strip() == "bound", res.describe()
