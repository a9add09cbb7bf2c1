"""POST /sandboxes/{id}/restore takes the compressions snapshots use (none,
gzip, zstd) and refuses the others with a 422 that names them, leaving no
sandbox behind; the gateway's unpacker never decodes them (no decoder for
them is linked in), it only recognises their first bytes."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import subprocess
import tarfile

import pytest

from tests.lib.client import new_id

TAR = {"Content-Type": "application/x-tar"}


def plain_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("tmp/hello.txt")
        data = b"compressed hello\n"
        info.size = len(data)
        info.mode = 0o644
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def zstd(data: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-c"], input=data, stdout=subprocess.PIPE, check=True).stdout


ACCEPTED = {"none": lambda d: d, "gzip": gzip.compress, "zstd": zstd}
REFUSED = {"xz": lzma.compress, "bzip2": bz2.compress,
           "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE)}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_restore_accepts_the_documented_compressions(client, shim, name):
    sid = new_id(f"rc-{name}")
    r = shim.request("POST", f"/sandboxes/{sid}/restore", ACCEPTED[name](plain_tar()), headers=TAR)
    client.created.add(sid)
    assert r.status == 201 and r.json() == {"sandbox_id": sid}, r
    assert client.sh(sid, "cat /tmp/hello.txt") == "compressed hello\n"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_restore_refuses_other_compressions_by_name(client, shim, name):
    sid = new_id(f"rc-{name}")
    r = shim.request("POST", f"/sandboxes/{sid}/restore", REFUSED[name](plain_tar()), headers=TAR)
    client.created.add(sid)
    assert r.status == 422, r
    detail = r.json()["detail"]
    assert isinstance(detail, str) and f"{name}-compressed" in detail and "gzip" in detail and "zstd" in detail, r
    # Nothing was created.
    assert shim.request("DELETE", f"/sandboxes/{sid}").status == 404


def test_restore_of_garbage_still_says_what_libarchive_says(client, shim):
    sid = new_id("rc-junk")
    r = shim.request("POST", f"/sandboxes/{sid}/restore", b"x" * 2048, headers=TAR)
    client.created.add(sid)
    assert r.status == 422, r
    assert "compressed" not in r.json()["detail"], r
