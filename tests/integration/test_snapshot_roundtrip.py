"""ExportSnapshot → Restore round trips: what a sandbox's writable layer
holds comes back in another sandbox, for every compression, and the stream
is a valid OCI image layer (a pax tar with whiteouts) that Python's tarfile
reads. Also: an export while a process keeps writing is consistent (the
sandbox is frozen) and the process goes on afterwards."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from tests.lib.client import SandboxClient, new_id, pb
from tests.lib.procs import wait_until
from tests.lib.snapshots import COMPRESSIONS, chunks_of, open_tar

# mtime set in the source sandbox (touch -d), with nanoseconds.
MTIME_TEXT = "2001-02-03 04:05:06.123456789 UTC"
MTIME_NS = 981173106123456789
XATTR_VALUE = b"value\x00with\xffbinary"

# Builds the source sandbox's layer: every kind of thing a layer can hold.
SETUP = r"""
set -e
test -e /etc/hostname          # in the image: deleted below
test -d /usr/share/doc          # in the image: replaced by an opaque dir
rm /etc/hostname
rm -rf /usr/share/doc && mkdir /usr/share/doc && echo x > /usr/share/doc/new
mkdir -p /root/snap/empty /root/snap/nested/deeper/deepest /root/snap/private
chmod 0700 /root/snap/private
printf 'hello\n' > /root/snap/file.txt
head -c 300000 /dev/urandom > /root/snap/random.bin
ln /root/snap/file.txt /root/snap/hard
ln -s /etc/passwd /root/snap/abs-link
ln -s file.txt /root/snap/rel-link
ln -s ../snap/nested /root/snap/nested/deeper/up-link
cp /bin/true /root/snap/setuid && chmod 4755 /root/snap/setuid
echo secret > /root/snap/secret && chmod 0600 /root/snap/secret
echo owned > /root/snap/owned && chown 1234:5678 /root/snap/owned
chown 1234:5678 /root/snap/private
echo old > /root/snap/old && touch -d '%s' /root/snap/old
python3 -c 'import os; os.setxattr("/root/snap/file.txt", "user.test", bytes.fromhex("%s"))'
echo ok
""" % (MTIME_TEXT, XATTR_VALUE.hex())

# Describes /root/snap and the image paths the layer changed, as JSON.
DESCRIBE = r"""
import hashlib, json, os, stat
out = {}
for dirpath, dirs, files in os.walk("/root/snap"):
    for name in sorted(dirs + files):
        p = os.path.join(dirpath, name)
        st = os.lstat(p)
        d = {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid, "ino": st.st_ino,
             "nlink": st.st_nlink, "mtime_ns": st.st_mtime_ns}
        if stat.S_ISLNK(st.st_mode):
            d["target"] = os.readlink(p)
        elif stat.S_ISREG(st.st_mode):
            d["sha256"] = hashlib.sha256(open(p, "rb").read()).hexdigest()
            try:
                d["xattr"] = os.getxattr(p, "user.test", follow_symlinks=False).hex()
            except OSError:
                pass
        elif stat.S_ISDIR(st.st_mode):
            d["entries"] = sorted(os.listdir(p))
        out[p] = d
out["/etc/hostname exists"] = os.path.lexists("/etc/hostname")
out["/usr/share/doc"] = sorted(os.listdir("/usr/share/doc"))
out["/usr/share/doc/new"] = open("/usr/share/doc/new").read()
out["rel-link reads"] = open("/root/snap/rel-link").read()
out["abs-link reads"] = open("/root/snap/abs-link").read()[:200]
print(json.dumps(out, sort_keys=True))
"""


@pytest.fixture(scope="module")
def source(gw):
    """A sandbox whose layer holds every kind of entry, and its description."""
    if not os.path.exists("/etc/hostname") or not os.path.isdir("/usr/share/doc"):
        pytest.skip("the image (the host's /) has no /etc/hostname or /usr/share/doc")
    c = SandboxClient(gw)
    sid = new_id("src")
    c.launch(sid)
    try:
        assert c.sh_out(sid, SETUP).strip() == "ok"
        described = json.loads(c.py_out(sid, DESCRIBE))
        yield c, sid, described
    finally:
        c.cleanup()


def _describe(c: SandboxClient, sid: str) -> dict:
    return json.loads(c.py_out(sid, DESCRIBE))


def _comparable(d: dict) -> dict:
    """The description without inode numbers (they differ between sandboxes)
    and without directory mtimes (checked by their own test below)."""
    def strip(v: dict) -> dict:
        drop = {"ino"} | ({"mtime_ns"} if "entries" in v else set())
        return {kk: vv for kk, vv in v.items() if kk not in drop}
    return {k: (strip(v) if isinstance(v, dict) else v) for k, v in d.items()}


def test_an_export_without_its_digest_is_the_same_stream(source):
    """skip_sha256 leaves the last chunk's sha256 empty and changes nothing
    else: the same bytes as an export with the digest, which is theirs."""
    c, src, _ = source
    hashed = c.export(src, timeout=120)
    plain = c.export(src, timeout=120, skip_sha256=True)
    assert plain.last.sha256 == ""
    assert hashed.last.sha256 == hashlib.sha256(plain.data).hexdigest()
    assert plain.data == hashed.data
    assert plain.last.total_bytes == hashed.last.total_bytes == len(plain.data)


@pytest.mark.parametrize("compression", list(COMPRESSIONS))
def test_export_restore_round_trip_keeps_everything(source, snap, compression):
    c, src, before = source
    ex = c.export(src, COMPRESSIONS[compression], timeout=120)

    # The stream: its hash and size are what the last chunk says.
    assert ex.last.sha256 == ex.sha256 == hashlib.sha256(ex.data).hexdigest()
    assert ex.last.total_bytes == ex.received_bytes == len(ex.data)
    magic = {"none": None, "gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}[compression]
    if magic is None:
        assert ex.data[257:262] == b"ustar", "a plain export is not an uncompressed tar"
    else:
        assert ex.data.startswith(magic), f"the {compression} export does not start with its magic"

    # Restored into another sandbox, the same tree comes back.
    dst = new_id("dst")
    info = snap.restore(dst, chunks_of(ex.data, 64 * 1024), timeout=120)
    assert info.sandbox_id == dst
    after = _describe(snap, dst)
    assert _comparable(after) == _comparable(before)

    # Spot checks of what the comparison above covers, with readable failures.
    r = "/root/snap/"
    assert after["/etc/hostname exists"] is False, "the deleted image file came back"
    assert after["/usr/share/doc"] == ["new"], "the opaque directory shows image files"
    assert after[r + "empty"]["entries"] == []
    assert after[r + "abs-link"]["target"] == "/etc/passwd"
    assert after[r + "rel-link"]["target"] == "file.txt"
    assert after["rel-link reads"] == "hello\n"
    assert after[r + "nested/deeper/up-link"]["target"] == "../snap/nested"
    assert after[r + "hard"]["ino"] == after[r + "file.txt"]["ino"], "the hard link is a copy"
    assert after[r + "file.txt"]["nlink"] == 2
    assert after[r + "setuid"]["mode"] == 0o104755
    assert after[r + "secret"]["mode"] == 0o100600
    assert after[r + "private"]["mode"] == 0o040700
    assert (after[r + "owned"]["uid"], after[r + "owned"]["gid"]) == (1234, 5678)
    assert (after[r + "private"]["uid"], after[r + "private"]["gid"]) == (1234, 5678)
    assert after[r + "old"]["mtime_ns"] == MTIME_NS
    assert bytes.fromhex(after[r + "file.txt"]["xattr"]) == XATTR_VALUE
    # ... and the same inode numbers for the hard link pair, via stat(1).
    ino = snap.sh_out(dst, "stat -c %i /root/snap/file.txt /root/snap/hard").split()
    assert ino[0] == ino[1]


@pytest.mark.parametrize("compression", list(COMPRESSIONS))
def test_export_is_a_valid_oci_layer_readable_by_tarfile(source, compression):
    c, src, _ = source
    ex = c.export(src, COMPRESSIONS[compression], timeout=120)
    with open_tar(ex.data) as tf:
        members = {m.name: m for m in tf.getmembers()}
    names = list(members)
    for n in names:
        assert not n.startswith(("/", "./")) and ".." not in n.split("/"), f"bad layer path {n!r}"
    # Whiteouts, OCI style.
    assert "etc/.wh.hostname" in members and members["etc/.wh.hostname"].isfile()
    assert members["etc/.wh.hostname"].size == 0
    assert "usr/share/doc/.wh..wh..opq" in members
    assert "usr/share/doc/new" in members
    assert not any(n.startswith("usr/share/doc/") and n not in
                   ("usr/share/doc/.wh..wh..opq", "usr/share/doc/new") for n in names)
    # Parents come before their children (a layer is applied in order).
    for i, n in enumerate(names):
        parent = n.rsplit("/", 1)[0] if "/" in n else None
        if parent:
            assert parent in names[:i], f"{n!r} comes before its directory"
    r = "root/snap/"
    assert members[r + "empty"].isdir()
    assert members[r + "abs-link"].issym() and members[r + "abs-link"].linkname == "/etc/passwd"
    assert members[r + "rel-link"].issym() and members[r + "rel-link"].linkname == "file.txt"
    hard = [members[r + "hard"], members[r + "file.txt"]]
    links = [m for m in hard if m.islnk()]
    assert len(links) == 1, "exactly one of the pair is stored as a hard link"
    assert links[0].linkname in (r + "hard", r + "file.txt")
    assert members[r + "setuid"].mode == 0o4755
    assert members[r + "secret"].mode == 0o600
    assert (members[r + "owned"].uid, members[r + "owned"].gid) == (1234, 5678)
    assert int(members[r + "old"].mtime) == MTIME_NS // 10**9
    assert members[r + "old"].pax_headers.get("mtime", "").startswith(str(MTIME_NS // 10**9) + ".123456789")
    assert members[r + "file.txt"].pax_headers.get("SCHILY.xattr.user.test") is not None
    assert not any(k.startswith("SCHILY.xattr.trusted.overlay.")
                   for m in members.values() for k in m.pax_headers)


def test_export_while_a_process_appends_is_consistent_and_the_process_continues(snap):
    sid = new_id("busy")
    snap.launch(sid)
    # One write(2) per numbered line, in a loop that only yields the CPU
    # briefly (so the 2 GiB disk does not fill up during the test).
    writer = ("import os, time\n"
              "fd = os.open('/root/log', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n"
              "i = 0\n"
              "while True:\n"
              "    i += 1\n"
              "    os.write(fd, b'%010d ' % i + b'x' * 200 + b'\\n')\n"
              "    time.sleep(0.0001)\n")
    snap.exec(sid, ["sh", "-c", "cat > /root/writer.py; "
                    "nohup python3 /root/writer.py </dev/null >/dev/null 2>&1 &"],
              stdin=writer.encode())
    # Let it write a fair amount first.
    size = lambda: int(snap.sh_out(sid, "stat -c %s /root/log 2>/dev/null || echo 0").strip() or 0)
    assert wait_until(lambda: size() > 200_000, timeout=60), "the writer did not get going"

    ex = snap.export(sid, pb.COMPRESSION_NONE, timeout=120)
    with open_tar(ex.data) as tf:
        log = tf.extractfile("root/log").read()
    assert log, "the log is empty in the export"
    assert log.endswith(b"\n"), f"torn write: the exported log ends with {log[-80:]!r}"
    lines = log.split(b"\n")[:-1]
    for n, line in enumerate(lines, start=1):
        assert line == b"%010d " % n + b"x" * 200, f"line {n} of the exported log is {line[:80]!r}"

    # The writer was thawed: the file grows beyond what was exported.
    assert wait_until(lambda: size() > len(log) + 100_000, timeout=60), \
        "the writer did not continue after the export"
    st = snap.sh_out(sid, "ps -o stat= -C python3 2>/dev/null || true")
    assert "T" not in st, f"a process is still stopped: {st!r}"


def test_restore_keeps_directory_mtimes(source, snap):
    """Directory mtimes survive too, also of directories with entries (whose
    mtime changes as their entries are created during the restore)."""
    c, src, before = source
    ex = c.export(src, pb.COMPRESSION_NONE, timeout=120)
    dst = new_id("dst")
    snap.restore(dst, chunks_of(ex.data), timeout=120)
    after = _describe(snap, dst)
    dirs = sorted(p for p, v in before.items() if isinstance(v, dict) and "entries" in v)
    assert dirs
    wrong = {p: (before[p]["mtime_ns"], after[p]["mtime_ns"]) for p in dirs
             if after[p]["mtime_ns"] != before[p]["mtime_ns"]}
    assert not wrong, f"directory mtimes not restored (exported, restored): {wrong}"


def test_renamed_image_directories_and_chmodded_image_files_survive_a_round_trip(snap):
    """What a sandbox does to the image (rename a directory of it, chmod or
    chown one of its files) is real data in its layer, so a snapshot, which
    carries no overlay metadata, brings it back."""
    sid = new_id("img")
    snap.launch(sid)
    snap.ok(sid, "mv /etc/apt /etc/apt-moved && chmod 600 /etc/hostname && chown 1000:1000 /etc/hosts"
                 " && sha256sum /etc/apt-moved/sources.list* /etc/hostname > /root/sums 2>/dev/null; true")
    before = snap.sh_out(sid, "ls -R /etc/apt-moved | sha256sum; stat -c '%a %u:%g' /etc/hostname /etc/hosts;"
                              " test -e /etc/apt && echo still-there || echo gone")
    data = snap.export(sid).data
    copy = new_id("img-copy")
    snap.restore(copy, chunks_of(data))
    after = snap.sh_out(copy, "ls -R /etc/apt-moved | sha256sum; stat -c '%a %u:%g' /etc/hostname /etc/hosts;"
                              " test -e /etc/apt && echo still-there || echo gone")
    assert after == before
    assert after.rstrip().endswith("gone"), after
    assert snap.sh_out(copy, "sha256sum -c /root/sums >/dev/null 2>&1 && echo same || echo differ") == "same\n"
