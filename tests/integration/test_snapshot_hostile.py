"""Restore refuses hostile tars (tests/snapshots/hostile/, see its README):
each is rejected with the right status and a message naming the problem,
and nothing is left behind — no sandbox in List, no mount or cgroup, and
nothing written on the host outside (the escape canary never appears)."""

from __future__ import annotations

import io
import random
import tarfile
from pathlib import Path

import grpc
import pytest

from tests.lib.client import SandboxClient, new_id
from tests.lib.gateway import GatewaySet, start_gateway
from tests.lib.grpc_clients import rpc_error
from tests.lib.procs import stop_checked, wait_until
from tests.lib.snapshots import HOSTILE_DIR, SNAPSHOTS_DIR, chunks_of
from tests.snapshots import make_hostile

CANARY = Path(make_hostile.CANARY)


@pytest.fixture(scope="module")
def gws(gateway_secret):
    """"default": stock settings; "limits": the small entry limit and disk
    quota the corpus's limit cases were made for."""
    gws = GatewaySet()
    try:
        gws["default"] = start_gateway(secret=gateway_secret)
        gws["limits"] = start_gateway({
            "SANDBOX_SNAPSHOT_MAX_ENTRIES": str(make_hostile.MAX_ENTRIES),
            "SANDBOX_DISK_MB": str(make_hostile.DISK_MB),
        }, secret=gateway_secret)
        yield gws
    finally:
        stop_checked(*gws.values())


@pytest.fixture(autouse=True)
def host_untouched():
    """The canary must not exist before a test (a leftover would hide an
    escape), and must not exist after it; the hard link attacks' target,
    /etc/passwd, keeps its content and link count."""
    if CANARY.exists() or CANARY.is_symlink():
        pytest.fail(f"{CANARY} exists before the test: remove it and rerun")
    passwd = Path("/etc/passwd")
    before = (passwd.stat().st_nlink, passwd.read_bytes())
    yield
    assert not (CANARY.exists() or CANARY.is_symlink()), f"a hostile tar wrote {CANARY} on the host"
    assert (passwd.stat().st_nlink, passwd.read_bytes()) == before, "/etc/passwd on the host changed"


def _assert_rejected(gw, data: bytes, status: str, words: list[str], piece: int = 64 * 1024):
    c = SandboxClient(gw)
    sid = new_id("hostile")
    try:
        # An empty tar is sent as one empty tar_chunk message.
        err = rpc_error(c.restore, sid, chunks_of(data, piece) if data else [b""], timeout=60)
        assert err.code() == getattr(grpc.StatusCode, status), \
            f"expected {status}, got {err.code().name}: {err.details()}"
        details = err.details() or ""
        for w in words:
            assert w.lower() in details.lower(), f"the message does not mention {w!r}: {details!r}"
        # Nothing left behind.
        assert sid not in c.ids(), "the rejected sandbox is listed"
        assert rpc_error(c.get, sid).code() == grpc.StatusCode.NOT_FOUND
        left = [] if wait_until(lambda: not gw.leftovers(), timeout=10) else gw.leftovers()
        assert not left, f"left behind: {left}"
        sandbox_dir = Path(gw.state_dir) / "sandboxes" / sid
        assert not sandbox_dir.exists(), f"{sandbox_dir} was left behind"
    finally:
        c.cleanup()
    return details


def test_corpus_is_current():
    """The committed corpus is what make_hostile.py generates."""
    files = make_hostile.build_all()
    for name, data in files.items():
        path = HOSTILE_DIR / name
        assert path.is_file(), f"{path} is missing: run tests/snapshots/make_hostile.py"
        assert path.read_bytes() == data, f"{path} is stale: run tests/snapshots/make_hostile.py"
    extra = sorted(p.name for p in HOSTILE_DIR.iterdir() if p.name not in files)
    assert not extra, f"files in {HOSTILE_DIR} that make_hostile.py does not make: {extra}"
    readme = (SNAPSHOTS_DIR / "README.md").read_text()
    for case in make_hostile.CASES:
        assert f"`{case.file}`" in readme, f"README.md does not document {case.file}"


@pytest.mark.parametrize("case", make_hostile.CASES, ids=lambda c: c.file)
def test_hostile_tar_is_rejected_and_leaves_nothing(gws, case):
    data = (HOSTILE_DIR / case.file).read_bytes()
    _assert_rejected(gws[case.gateway], data, case.status, [case.message])


def test_hostile_tar_in_one_byte_pieces_is_rejected(gws):
    """The unpacker sees a stream, not messages: the same attack cut into
    1-byte pieces is caught the same way."""
    data = (HOSTILE_DIR / "symlink-then-file.tar").read_bytes()
    _assert_rejected(gws["default"], data[:3072], "INVALID_ARGUMENT", ["symlink"], piece=1)


def test_restore_with_only_a_header_is_rejected(gws):
    """No tar_chunk at all (the stream ends after the header)."""
    c = SandboxClient(gws["default"])
    sid = new_id("hdronly")
    try:
        err = rpc_error(c.restore, sid, [], timeout=60)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "snapshot" in err.details()
        assert sid not in c.ids()
        assert wait_until(lambda: not gws["default"].leftovers(), timeout=10), gws["default"].leftovers()
    finally:
        c.cleanup()


def test_incompressible_tar_over_the_quota_is_resource_exhausted(gws):
    """24 MiB of random data into a 16 MiB disk: RESOURCE_EXHAUSTED, never a
    sandbox with a silently truncated file. (Generated here rather than
    committed: random data does not compress.)"""
    payload = random.Random(7).randbytes(24 * 1024 * 1024)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo("big.bin")
        ti.size = len(payload)
        tf.addfile(ti, io.BytesIO(payload))
    _assert_rejected(gws["limits"], buf.getvalue(), "RESOURCE_EXHAUSTED", ["quota"],
                     piece=1024 * 1024)


def test_gateway_still_restores_after_the_hostile_corpus(gws):
    """After all the rejections, a good tar still restores."""
    c = SandboxClient(gws["default"])
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            ti = tarfile.TarInfo("root/ok.txt")
            ti.size = 3
            tf.addfile(ti, io.BytesIO(b"ok\n"))
        sid = new_id("good")
        c.restore(sid, [buf.getvalue()], timeout=60)
        assert c.sh_out(sid, "cat /root/ok.txt") == "ok\n"
    finally:
        c.cleanup()
