"""Sparse files stay sparse: export finds the data with SEEK_DATA/SEEK_HOLE
and writes pax sparse entries, so an export holds the data a sandbox has,
never its files' apparent sizes; restore recreates the holes."""

from __future__ import annotations

import pytest

from tests.lib.client import new_id
from tests.lib.snapshots import chunks_of, open_tar

TIB = 1 << 40


def test_a_terabyte_sparse_file_exports_as_its_data_and_restores_sparse(snap):
    sid = new_id("sparse")
    snap.launch(sid)
    snap.ok(sid, "truncate -s 1T /tmp/huge && printf X | dd of=/tmp/huge bs=1 seek=123456789 conv=notrunc 2>/dev/null")
    ex = snap.export(sid)
    assert len(ex.data) < 256 * 1024, len(ex.data)
    member = next(m for m in open_tar(ex.data).getmembers() if m.name.endswith("tmp/huge"))
    assert member.size == TIB and member.sparse, member
    copy = new_id("sparse-copy")
    snap.restore(copy, chunks_of(ex.data))
    out = snap.sh_out(copy, "stat -c '%s %b' /tmp/huge; dd if=/tmp/huge bs=1 skip=123456789 count=1 2>/dev/null")
    size, blocks, byte = out.split()
    assert int(size) == TIB and int(blocks) <= 64 and byte == "X", out


@pytest.mark.parametrize("layout", [
    "truncate -s 10M f && dd if=/dev/urandom of=f bs=4096 count=3 seek=100 conv=notrunc",
    "dd if=/dev/urandom of=f bs=1M count=2 && truncate -s 9M f",  # data, then a hole to the end
    "truncate -s 5M f && dd if=/dev/urandom of=f bs=1 count=5 seek=5242875 conv=notrunc",  # data at the very end
    "truncate -s 3M f",  # all hole
])
def test_sparse_files_round_trip_identical(snap, layout):
    sid = new_id("sparse")
    snap.launch(sid)
    snap.ok(sid, f"cd /root && {layout} 2>/dev/null")
    before = snap.sh_out(sid, "cd /root && stat -c %s f && sha256sum f")
    ex = snap.export(sid)
    copy = new_id("sparse-copy")
    snap.restore(copy, chunks_of(ex.data))
    after = snap.sh_out(copy, "cd /root && stat -c %s f && sha256sum f")
    assert after == before
    used = int(snap.sh_out(copy, "stat -c %b /root/f"))
    assert used * 512 <= 2 * (1 << 20) + 65536, used


def test_a_restored_sandbox_writes_sparse_files_page_by_page(snap):
    """A restore fills the disk in large folios; the sandbox that runs after
    it does not: one byte it writes into a sparse file costs a page, as in a
    launched sandbox, and its export holds that byte's page, not 2 MiB."""
    src = new_id("sparse")
    snap.launch(src)
    snap.ok(src, "head -c 8M /dev/urandom > /root/data")
    ex = snap.export(src)
    copy = new_id("sparse-copy")
    snap.restore(copy, chunks_of(ex.data))
    snap.ok(copy, "truncate -s 1G /root/s && printf X | dd of=/root/s bs=1 seek=104857600 conv=notrunc 2>/dev/null")
    assert int(snap.sh_out(copy, "stat -c %b /root/s")) <= 64
    again = snap.export(copy)
    assert len(again.data) < len(ex.data) + 256 * 1024, (len(again.data), len(ex.data))
