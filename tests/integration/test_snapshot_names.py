"""Every name round-trips. Whatever a sandbox can name a file — names that
begin with the OCI whiteout prefix (".wh.x", ".wh..wh..opq"), newlines,
255 bytes, bytes that are not UTF-8 — survives export -> restore
identically, alongside real whiteouts of image files, hard links and
extended attributes; and snapshots stay valid OCI layers (a user's ".wh."
names travel escaped in the reserved ".wh..wh." space)."""

from __future__ import annotations

from tests.lib.client import new_id
from tests.lib.snapshots import chunks_of, open_tar

MAKE = r"""
import os
os.makedirs(b"/root/t/.wh.dir/inner", exist_ok=True)
def w(p, data):
    with open(p, "wb") as f:
        f.write(data)
w(b"/root/t/x", b"x")
w(b"/root/t/.wh.x", b"not a whiteout")
w(b"/root/t/.wh..wh..opq", b"not an opaque marker")
w(b"/root/t/.wh.dir/inner/f", b"inside")
w(b"/root/t/new\nline", b"nl")
w(b"/root/t/" + b"n" * 255, b"long")
w(b"/root/t/.wh." + b"w" * 251, b"long whiteout-like")
w(b"/root/t/.wh.", b"the bare prefix")  # its stored form is exactly the escape plus ".wh."
os.makedirs(b"/root/t/sub/.wh.", exist_ok=True)
w(b"/root/t/sub/.wh./f", b"below the bare prefix")
w(b"/root/t/\xff\xfe-latin1-\xe9", b"bytes")
os.link(b"/root/t/x", b"/root/t/.wh.hardlink")
os.symlink(b".wh.x", b"/root/t/.wh.link")
os.setxattr(b"/root/t/.wh.x", "user.note", b"kept")
os.remove("/etc/hostname")  # a real whiteout of an image file
"""

MANIFEST = r"""
import hashlib, os, stat
out = []
for root, dirs, files in os.walk(b"/root/t"):
    dirs.sort()
    for n in sorted(dirs + files):
        p = os.path.join(root, n)
        st = os.lstat(p)
        kind = stat.S_IFMT(st.st_mode)
        h = ""
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()[:16]
        if stat.S_ISLNK(st.st_mode):
            h = os.readlink(p).hex()
        xa = sorted((a, os.getxattr(p, a, follow_symlinks=False).hex()) for a in os.listxattr(p, follow_symlinks=False))
        out.append((p.hex(), kind, oct(st.st_mode & 0o7777), st.st_nlink, st.st_size, h, xa))
print(repr(out))
print(os.path.exists("/etc/hostname"))
"""


def test_every_name_a_sandbox_can_make_round_trips(snap):
    sid = new_id("names")
    snap.launch(sid)
    res = snap.py(sid, MAKE)
    assert res.code == 0, res.describe()
    before = snap.py_out(sid, MANIFEST)
    data = snap.export(sid).data
    names = [m.name for m in open_tar(data).getmembers()]
    assert any(n.endswith("etc/.wh.hostname") for n in names), names  # the real whiteout
    assert not any(n.endswith("root/t/.wh.x") for n in names), names  # the user's name, escaped
    copy = new_id("names-copy")
    snap.restore(copy, chunks_of(data))
    after = snap.py_out(copy, MANIFEST)
    assert after == before
    assert after.rstrip().endswith("False")  # /etc/hostname stays deleted


def test_a_round_trip_twice_is_stable(snap):
    sid = new_id("names2")
    snap.launch(sid)
    assert snap.py(sid, MAKE).code == 0
    first = snap.export(sid).data
    copy = new_id("names2-copy")
    snap.restore(copy, chunks_of(first))
    second = snap.export(copy).data
    names = lambda d: sorted(m.name for m in open_tar(d).getmembers())  # noqa: E731
    assert names(first) == names(second)


def test_a_snapshot_of_the_previous_release_still_restores(snap):
    """tests/snapshots/round1/basic.tar was exported by the previous
    release: files, modes, owners, a symlink, a hard link, a whiteout of an
    image file and an opaque directory."""
    from pathlib import Path
    data = (Path(__file__).resolve().parents[1] / "snapshots" / "round1" / "basic.tar").read_bytes()
    sid = new_id("round1")
    snap.restore(sid, chunks_of(data))
    out = snap.sh_out(sid, "cat /root/proj/src/main.py; stat -c '%a %u:%g' /root/proj/src/main.py /root/proj/src;"
                           " readlink /root/proj/run; stat -c %h /root/proj/hard; ls /etc/apt;"
                           " test -e /etc/hostname && echo hostname || echo no-hostname")
    assert out == "print(1)\n755 0:0\n755 1000:1000\nsrc/main.py\n2\nonly\nno-hostname\n", out


def test_directories_repeated_in_a_tar_keep_their_last_time(snap):
    """A tar may name a directory any number of times, interleaved with
    others: each keeps the time of its last entry (one record per directory
    in the unpacker, whatever the order)."""
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for rnd in range(3):
            for d in range(300):
                info = tarfile.TarInfo(f"root/d{d}")
                info.type = tarfile.DIRTYPE
                info.mtime = 1_600_000_000 + rnd * 1000 + d
                tf.addfile(info)
    sid = new_id("dirs")
    snap.restore(sid, chunks_of(buf.getvalue()))
    out = snap.sh_out(sid, "for d in 0 1 150 299; do stat -c %Y /root/d$d; done")
    assert out.split() == [str(1_600_002_000 + d) for d in (0, 1, 150, 299)], out
