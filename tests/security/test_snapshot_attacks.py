"""Snapshot attacks from inside a sandbox: what its layer holds when it is
exported (symlinks and hard links to host files, fifos, device nodes, a
directory swapped for a symlink while exporting), and restoring such tars
into a fresh sandbox. The export must never carry a file from outside the
sandbox's own layer, never block, and restoring must never write outside
the new sandbox."""

from __future__ import annotations

import io
import os
import secrets
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.lib.client import sandbox_client
from tests.lib.security import host_shadow_secret
from tests.lib.snapshots import chunks_of, tar_members


@pytest.fixture(scope="module")
def snap(gateway):
    with sandbox_client(gateway) as s:
        yield s


def assert_clean_tar(data: bytes, canary_token: str) -> list:
    members = tar_members(data)
    shadow = host_shadow_secret()
    for m, content in members:
        assert not m.name.startswith(("/", "../")) and "/../" not in m.name, m.name
        assert not (m.ischr() or m.isblk() or m.isfifo()), f"special file {m.name} in the export"
        assert canary_token.encode() not in content, f"{m.name} carries the host canary"
        if shadow is not None:
            assert shadow not in content, f"{m.name} carries the host's /etc/shadow"
    assert canary_token.encode() not in data
    return members


def test_links_fifos_and_nodes_export_safely(snap, host_canary):
    # Technique: plant symlinks to host paths (the canary, /etc/shadow, /),
    # hard links to lower-layer files (overlay copies them up), a fifo (an
    # exporter that opens it blocks forever) and device nodes (mknod is
    # denied anyway).
    canary, token = host_canary
    sid = snap.launch().sandbox_id
    snap.sh_out(sid, f"""
cd /root
ln -s {canary} canary-link; ln -s /etc/shadow shadow-link; ln -s / hostroot; ln -s ../../../../.. up
ln /usr/bin/yes y-hardlink 2>/dev/null || true
ln /etc/passwd passwd-hardlink 2>/dev/null || true
mkfifo fifo; mkfifo /tmp/fifo2
mknod blk b 8 0 2>/dev/null || true
mknod chr c 1 1 2>/dev/null || true
mkdir -p d/e && ln -s /etc d/e/etc
""")
    t0 = time.monotonic()
    ex = snap.export(sid, timeout=60)
    assert time.monotonic() - t0 < 30, "the export took long: did it block on a fifo?"
    members = {m.name: m for m, _ in assert_clean_tar(ex.data, token)}
    assert members["root/canary-link"].issym() and members["root/canary-link"].linkname == str(canary)
    assert members["root/shadow-link"].issym()
    assert "root/fifo" not in members and "root/blk" not in members and "root/chr" not in members
    # Restore into a fresh sandbox: the links resolve inside it.
    restored = f"r-{secrets.token_hex(5)}"
    snap.restore(restored, chunks_of(ex.data))
    res = snap.exec(restored, ["sh", "-c", "cat /root/canary-link; ls /root/hostroot/ >/dev/null && echo listed"])
    assert token not in res.out, res.describe()
    snap.delete(restored)
    snap.delete(sid)


def _tar(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for info, data in entries:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _entry(name, kind=tarfile.REGTYPE, data=b"", linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = linkname
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def test_restoring_a_tar_that_writes_through_symlinks_stays_inside(snap, gateway):
    # Technique: a symlink entry pointing at a host directory followed by a
    # file "through" it; a hard link to a host file; absolute and ".." names
    # (the hostile corpus covers more; these are the ones an exported
    # sandbox could produce itself).
    outside = Path(f"/tmp/sgw-outside-{secrets.token_hex(6)}")
    outside.mkdir()
    try:
        cases = {
            "symlink-dir": [_entry("d", tarfile.SYMTYPE, linkname=str(outside)),
                            _entry("d/pwned", data=b"pwned")],
            "symlink-dotdot": [_entry("e", tarfile.SYMTYPE, linkname="../../../../../../../.." + str(outside)),
                               _entry("e/pwned", data=b"pwned")],
            "hardlink-host": [_entry("h", tarfile.LNKTYPE, linkname="/etc/passwd")],
            "hardlink-dotdot": [_entry("h", tarfile.LNKTYPE, linkname="../../../../etc/passwd")],
            "absolute": [_entry(str(outside) + "/pwned", data=b"pwned")],
            "dotdot": [_entry("../../../../../.." + str(outside) + "/pwned", data=b"pwned")],
        }
        for name, entries in cases.items():
            sid = f"r-{secrets.token_hex(5)}"
            try:
                snap.restore(sid, chunks_of(_tar(entries)), timeout=60)
                snap.delete(sid)
            except Exception:
                pass  # rejected: fine
            assert list(outside.iterdir()) == [], f"{name}: wrote outside the sandbox"
        # The host's /etc/passwd is untouched and not linked anywhere new.
        assert os.stat("/etc/passwd").st_nlink == 1
    finally:
        for p in outside.iterdir():
            p.unlink()
        outside.rmdir()


def test_directory_swapped_for_a_symlink_during_export(snap, host_canary):
    # Technique: a loop inside the sandbox keeps replacing a directory with
    # a symlink to / (and to the canary's directory) while the test exports
    # again and again: an exporter that checks a path and then opens it
    # would follow the symlink into the host.
    canary, token = host_canary
    sid = snap.launch().sandbox_id
    snap.sh_out(sid, "mkdir -p /root/d/sub && echo inner > /root/d/sub/file && echo x > /root/d/f")
    loop = (f"nohup sh -c 'while :; do mv /root/d /root/d2; ln -s / /root/d; rm -f /root/d; "
            f"ln -s {canary.parent} /root/d; rm -f /root/d; mv /root/d2 /root/d; done' >/dev/null 2>&1 &")
    snap.sh_out(sid, loop)
    seen_dir = 0
    for _ in range(8):
        ex = snap.export(sid, timeout=60)
        members = assert_clean_tar(ex.data, token)
        names = {m.name for m, _ in members}
        # Never anything from the host's root below root/d or root/d2.
        for n in names:
            for top in ("root/d/", "root/d2/"):
                if n.startswith(top):
                    assert n[len(top):].split("/")[0] in ("sub", "f", ".wh..wh..opq"), n
        seen_dir += any(n in ("root/d/sub/file", "root/d2/sub/file") for n in names)
        restored = f"r-{secrets.token_hex(5)}"
        snap.restore(restored, chunks_of(ex.data))
        assert snap.exec(restored, ["cat", str(canary)]).out.find(token) < 0
        snap.delete(restored)
    assert seen_dir > 0, "the directory never made it into an export"
    # The sandbox was thawed after each export: its loop still runs.
    assert "mv /root/d" in snap.sh_out(sid, "ps -eo args")
    snap.sh_out(sid, "pkill -f '[w]hile :' || true")
    snap.delete(sid)
