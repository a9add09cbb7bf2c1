#!/usr/bin/env python3
"""Generates tests/snapshots/hostile/: one small tar per attack on Restore.

Deterministic: fixed names, mtimes, owners and a seeded random generator,
gzip written with mtime 0, so running it again gives byte-identical files
(`make_hostile.py --check` verifies that the committed corpus is current).

    python3 tests/snapshots/make_hostile.py            # (re)write the corpus
    python3 tests/snapshots/make_hostile.py --check    # exit 1 if stale

CASES below is the single list of attacks: file name, expected gRPC status,
a word the error message must contain, the attack's description, and the
function that builds the bytes. tests/integration/test_snapshot_hostile.py
imports it, and README.md lists the same table (regenerate it with
--readme when CASES changes).

Every escape attempt aims at /tmp/sgw-escape-canary (or /etc/passwd for
hard links): the test checks that the canary never appears on the host.
"""

from __future__ import annotations

import argparse
import gzip
import io
import random
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
OUT = HERE / "hostile"
CANARY = "/tmp/sgw-escape-canary"
MTIME = 1_700_000_000

# Settings of the gateway the corpus is checked against (the test starts it
# with these): small enough that the entry and quota cases stay tiny.
MAX_ENTRIES = 100
DISK_MB = 16


def _info(name: str, type_=tarfile.REGTYPE, size: int = 0, mode: int = 0o644,
          linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = type_
    ti.size = size
    ti.mode = mode
    ti.mtime = MTIME
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    ti.linkname = linkname
    return ti


class _Tar:
    """A pax tar built in memory, entry by entry."""

    def __init__(self):
        self.buf = io.BytesIO()
        self.tf = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)

    def file(self, name: str, data: bytes = b"", mode: int = 0o644) -> "_Tar":
        self.tf.addfile(_info(name, size=len(data), mode=mode), io.BytesIO(data))
        return self

    def dir(self, name: str, mode: int = 0o755) -> "_Tar":
        self.tf.addfile(_info(name, tarfile.DIRTYPE, mode=mode))
        return self

    def symlink(self, name: str, target: str) -> "_Tar":
        self.tf.addfile(_info(name, tarfile.SYMTYPE, mode=0o777, linkname=target))
        return self

    def hardlink(self, name: str, target: str) -> "_Tar":
        self.tf.addfile(_info(name, tarfile.LNKTYPE, linkname=target))
        return self

    def special(self, name: str, type_: bytes, major: int = 0, minor: int = 0) -> "_Tar":
        ti = _info(name, type_, mode=0o666)
        ti.devmajor, ti.devminor = major, minor
        self.tf.addfile(ti)
        return self

    def raw(self, ti: tarfile.TarInfo, data: bytes = b"") -> "_Tar":
        self.tf.addfile(ti, io.BytesIO(data) if data else None)
        return self

    def bytes(self) -> bytes:
        self.tf.close()
        # Up to the end-of-archive blocks, without tarfile's padding to a
        # full 10 KiB record (keeps the committed files small).
        return self.buf.getvalue()[:self.tf.offset]


def _gzip(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9, mtime=0, filename="") as g:
        g.write(data)
    return out.getvalue()


def _random(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


# --- the attacks --------------------------------------------------------------

def absolute_path() -> bytes:
    return _Tar().file(CANARY, b"escaped\n").bytes()


def dotdot_component() -> bytes:
    return _Tar().dir("a").file("a/../../../../../../tmp/sgw-escape-canary", b"escaped\n").bytes()


def dot_slash_dotdot() -> bytes:
    return _Tar().file("./../../../../../../tmp/sgw-escape-canary", b"escaped\n").bytes()


def symlink_then_file_through_it() -> bytes:
    # The symlink is harmless by itself; the next entry writes through it.
    return (_Tar().symlink("esc", "/tmp")
            .file("esc/sgw-escape-canary", b"escaped\n").bytes())


def symlink_dir_then_file_below() -> bytes:
    # A relative symlink to a directory that exists in the layer, then a
    # file two levels below it.
    return (_Tar().dir("tmp").dir("tmp/sub").symlink("d", "../../../../../../tmp")
            .file("d/sub/sgw-escape-canary", b"escaped\n").bytes())


def hardlink_absolute() -> bytes:
    return _Tar().hardlink("passwd-link", "/etc/passwd").bytes()


def hardlink_dotdot() -> bytes:
    return _Tar().hardlink("passwd-link", "../../../../../../etc/passwd").bytes()


def hardlink_not_yet_existing() -> bytes:
    return _Tar().hardlink("early-link", "later").file("later", b"later\n").bytes()


def hardlink_to_symlink() -> bytes:
    # A hard link to a symlink that points outside: linking the symlink
    # itself would be harmless, but only links to regular files are allowed.
    return _Tar().symlink("s", CANARY).hardlink("s-link", "s").bytes()


def char_device() -> bytes:
    return _Tar().special("mem", tarfile.CHRTYPE, 1, 1).bytes()  # /dev/mem


def block_device() -> bytes:
    return _Tar().special("disk", tarfile.BLKTYPE, 8, 0).bytes()  # /dev/sda


def fifo() -> bytes:
    return _Tar().special("pipe", tarfile.FIFOTYPE).bytes()


def pax_path_absolute() -> bytes:
    # The ustar name is harmless; the pax "path" record that overrides it
    # is absolute.
    ti = _info("harmless", size=8)
    ti.pax_headers = {"path": CANARY}
    t = _Tar()
    t.tf.addfile(ti, io.BytesIO(b"escaped\n"))
    return t.bytes()


def gzip_of_garbage() -> bytes:
    return _gzip(_random(4096, seed=1))


def truncated_tar() -> bytes:
    whole = _Tar().file("big", _random(64 * 1024, seed=2)).bytes()
    return whole[:512 + 10 * 1024 + 100]  # pax header + header + part of the data


def zero_length() -> bytes:
    return b""


def random_garbage() -> bytes:
    return _random(8192, seed=3)


def whiteout_of_contained_path() -> bytes:
    return _Tar().dir("d").file("d/x", b"x\n").file("d/.wh.x").bytes()


def whiteout_before_contained_path() -> bytes:
    return _Tar().dir("d").file("d/.wh.x").file("d/x", b"x\n").bytes()


def whiteout_not_a_file() -> bytes:
    return _Tar().dir("d").symlink("d/.wh.x", CANARY).bytes()


def whiteout_dotdot() -> bytes:
    return _Tar().dir("d").file("d/.wh..").bytes()


def whiteout_through_symlink() -> bytes:
    # The whiteout's directory is a symlink: whiteouts must not be written
    # through symlinks any more than files are.
    return (_Tar().dir("real").symlink("link", "real")
            .file("link/.wh.victim").bytes())


def whiteout_through_dangling_symlink() -> bytes:
    return _Tar().symlink("link", "/nonexistent").file("link/.wh.x").bytes()


def opaque_through_symlink() -> bytes:
    return _Tar().dir("real").symlink("link", "real").file("link/.wh..wh..opq").bytes()


def file_below_dangling_symlink() -> bytes:
    # The file's parent directories would have to be made through the symlink.
    return _Tar().symlink("link", "/nonexistent/dir").file("link/sub/x", b"x\n").bytes()


def file_below_a_file() -> bytes:
    return _Tar().file("f", b"f\n").file("f/below", b"x\n").bytes()


def too_many_entries() -> bytes:
    t = _Tar()
    for i in range(MAX_ENTRIES + 1):
        t.file(f"f{i:04d}")
    return t.bytes()


def over_quota() -> bytes:
    # 40 MiB of zeros in a 16 MiB disk; gzip keeps the committed file small.
    size = 40 * 1024 * 1024
    ti = _info("big", size=size)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as g:
        with tarfile.open(fileobj=g, mode="w|", format=tarfile.PAX_FORMAT) as tf:
            tf.addfile(ti, _Zeros(size))
    return buf.getvalue()


class _Zeros(io.RawIOBase):
    def __init__(self, n: int):
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


@dataclass(frozen=True)
class Case:
    file: str
    status: str          # grpc.StatusCode name
    message: str         # a word (case-insensitive) the error message must contain
    attack: str
    build: Callable[[], bytes]
    gateway: str = "default"  # "limits": MAX_ENTRIES / DISK_MB gateway


INVALID = "INVALID_ARGUMENT"

CASES: list[Case] = [
    Case("absolute-path.tar", INVALID, "unsafe path",
         f"regular file at the absolute path {CANARY}", absolute_path),
    Case("dotdot-component.tar", INVALID, "unsafe path",
         "`a/../../../../../../tmp/sgw-escape-canary`: a `..` component", dotdot_component),
    Case("dot-slash-dotdot.tar", INVALID, "unsafe path",
         "`./../../…/tmp/sgw-escape-canary`: `./` prefix hiding a `..` escape", dot_slash_dotdot),
    Case("pax-path-absolute.tar", INVALID, "unsafe path",
         "harmless ustar name overridden by an absolute pax `path` record", pax_path_absolute),
    Case("symlink-then-file.tar", INVALID, "symlink",
         "symlink `esc -> /tmp`, then the file `esc/sgw-escape-canary` written through it",
         symlink_then_file_through_it),
    Case("symlink-dir-then-file-below.tar", INVALID, "symlink",
         "symlink `d -> ../../../../../../tmp` (an existing directory), then `d/sub/sgw-escape-canary`",
         symlink_dir_then_file_below),
    Case("hardlink-absolute.tar", INVALID, "hard link",
         "hard link to `/etc/passwd`", hardlink_absolute),
    Case("hardlink-dotdot.tar", INVALID, "hard link",
         "hard link to `../../../../../../etc/passwd`", hardlink_dotdot),
    Case("hardlink-not-yet-existing.tar", INVALID, "hard link",
         "hard link to `later`, a file that only comes after it", hardlink_not_yet_existing),
    Case("hardlink-to-symlink.tar", INVALID, "hard link",
         f"hard link to a symlink that points at {CANARY}", hardlink_to_symlink),
    Case("char-device.tar", INVALID, "device",
         "character device 1:1 (/dev/mem)", char_device),
    Case("block-device.tar", INVALID, "device",
         "block device 8:0 (/dev/sda)", block_device),
    Case("fifo.tar", INVALID, "fifo",
         "named pipe", fifo),
    Case("gzip-of-garbage.tar.gz", INVALID, "bad snapshot",
         "valid gzip whose content is 4 KiB of random bytes", gzip_of_garbage),
    Case("truncated.tar", INVALID, "bad snapshot",
         "tar cut off in the middle of a 64 KiB file's data", truncated_tar),
    Case("zero-length.tar", INVALID, "snapshot",
         "no bytes at all", zero_length),
    Case("random-garbage.bin", INVALID, "bad snapshot",
         "8 KiB of random bytes", random_garbage),
    Case("whiteout-of-contained-path.tar", INVALID, "whiteout",
         "`d/x`, then its whiteout `d/.wh.x`", whiteout_of_contained_path),
    Case("whiteout-before-contained-path.tar", INVALID, "whiteout",
         "whiteout `d/.wh.x`, then `d/x` itself", whiteout_before_contained_path),
    Case("whiteout-not-a-file.tar", INVALID, "whiteout",
         "whiteout `d/.wh.x` that is a symlink", whiteout_not_a_file),
    Case("whiteout-dotdot.tar", INVALID, "whiteout",
         "whiteout `d/.wh..` (of `.`)", whiteout_dotdot),
    Case("whiteout-through-symlink.tar", INVALID, "symlink",
         "symlink `link -> real`, then the whiteout `link/.wh.victim` through it",
         whiteout_through_symlink),
    Case("whiteout-through-dangling-symlink.tar", INVALID, "symlink",
         "symlink `link -> /nonexistent`, then the whiteout `link/.wh.x` through it",
         whiteout_through_dangling_symlink),
    Case("opaque-through-symlink.tar", INVALID, "symlink",
         "symlink `link -> real`, then the opaque marker `link/.wh..wh..opq` through it",
         opaque_through_symlink),
    Case("file-below-dangling-symlink.tar", INVALID, "symlink",
         "symlink `link -> /nonexistent/dir`, then `link/sub/x` (parents made through the symlink)",
         file_below_dangling_symlink),
    Case("file-below-a-file.tar", INVALID, "snapshot",
         "regular file `f`, then `f/below` (a regular file used as a directory)", file_below_a_file),
    Case("too-many-entries.tar", INVALID, "entries",
         f"{MAX_ENTRIES + 1} empty files (gateway with SANDBOX_SNAPSHOT_MAX_ENTRIES={MAX_ENTRIES})",
         too_many_entries, gateway="limits"),
    Case("over-quota.tar.gz", "RESOURCE_EXHAUSTED", "quota",
         f"a 40 MiB file of zeros, gzip (gateway with SANDBOX_DISK_MB={DISK_MB})",
         over_quota, gateway="limits"),
]

# Attacks a tar cannot express: documented, not generated.
NOT_EXPRESSIBLE = [
    ("socket", "tar has no entry type for a socket (Python's tarfile cannot write one, and "
               "libarchive reads unknown type flags as regular files), so there is no socket "
               "entry to reject"),
]


def readme_table() -> str:
    lines = ["| file | attack | expected status | message mentions |",
             "|---|---|---|---|"]
    for c in CASES:
        lines.append(f"| `{c.file}` | {c.attack} | {c.status} | {c.message} |")
    return "\n".join(lines)


def build_all() -> dict[str, bytes]:
    return {c.file: c.build() for c in CASES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed corpus is stale")
    ap.add_argument("--readme", action="store_true", help="print the README table")
    args = ap.parse_args()
    if args.readme:
        print(readme_table())
        return 0
    files = build_all()
    if args.check:
        stale = [name for name, data in files.items()
                 if not (OUT / name).is_file() or (OUT / name).read_bytes() != data]
        extra = sorted(p.name for p in OUT.iterdir() if p.name not in files) if OUT.is_dir() else []
        for name in stale:
            print(f"stale: {name}", file=sys.stderr)
        for name in extra:
            print(f"not generated: {name}", file=sys.stderr)
        return 1 if stale or extra else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for p in OUT.iterdir():
        if p.name not in files:
            p.unlink()
    for name, data in files.items():
        (OUT / name).write_bytes(data)
    total = sum(len(d) for d in files.values())
    print(f"wrote {len(files)} files ({total} bytes) to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
