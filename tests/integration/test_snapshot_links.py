"""The export's hard-link table is bounded by construction: a file's first
path is never stored whole (a directory's path is stored once, however
many linked files it holds), the gateway's memory grows by little during
an export of many hard links under a deep path and gives it back after,
and past SNAP_EXPORT_MAX_HARD_LINKS linked files the export fails with a
clear RESOURCE_EXHAUSTED rather than grow."""

from __future__ import annotations

import grpc
import pytest

from tests.lib.client import new_id, sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.procs import RssSampler, vm_rss_kib
from tests.lib.snapshots import chunks_of, open_tar

# gateway/snapshot/links.h
MAX_HARD_LINKS = 131072

# A directory ~3.8 KB deep: 15 components of 250 characters.
DEEP = "/root/" + "/".join(f"{i:02d}" + "d" * 248 for i in range(15))


def make_linked_files(client, sid, where: str, count: int):
    """`count` files in `where`, each with a second link in `where`/l."""
    client.ok(sid, f"mkdir -p '{where}/f' && cd '{where}/f' && seq 1 {count} | xargs touch "
                   f"&& cp -al '{where}/f' '{where}/l'", timeout_seconds=120, rpc_timeout=150)


def test_an_export_of_many_hard_links_under_a_deep_path_costs_little_memory(snap, gw):
    sid = new_id("links")
    snap.launch(sid)
    n = 20000
    make_linked_files(snap, sid, DEEP, n)
    before = vm_rss_kib(gw.pid)
    with RssSampler(gw) as rss:
        ex = snap.export(sid, keep=True, timeout=60)
    after = vm_rss_kib(gw.pid)
    # The table of full paths took ~4 KB a link (about 80 MiB here, most of
    # it kept after); the compact table takes ~50 bytes a link.
    assert rss.growth_mib < 40, f"the gateway grew by {rss.growth_mib:.0f} MiB during the export"
    assert (after - before) / 1024 < 16, f"the gateway kept {(after - before) / 1024:.0f} MiB after the export"
    members = open_tar(ex.data).getmembers()
    links = [m for m in members if m.islnk()]
    assert len(links) == n, len(links)
    assert all(m.linkname.replace("/l/", "/f/", 1) == m.name.replace("/l/", "/f/", 1) for m in links[:50])
    # Restored, they are links of the same inodes again.
    copy = new_id("links-copy")
    snap.restore(copy, chunks_of(ex.data), timeout=60)
    out = snap.sh_out(copy, f"cd '{DEEP}' && stat -c %h f/1 l/1 f/{n} && "
                            f"[ $(stat -c %i f/777) = $(stat -c %i l/777) ] && echo same")
    assert out.split() == ["2", "2", "2", "same"], out


@pytest.fixture
def big_disk(gateway_secret):
    """A gateway whose sandboxes have room for more linked files than the
    cap (tmpfs counts every link against the disk's inodes: SANDBOX_DISK_MB
    x 128, 262 144 by default, allow 131 072 files of two links)."""
    with running_gateway({"SANDBOX_DISK_MB": "4096"}, secret=gateway_secret, check=True) as gw:
        with sandbox_client(gw) as c:
            yield c


def test_past_the_hard_link_cap_the_export_fails_clearly(big_disk):
    snap = big_disk
    sid = new_id("links-cap")
    snap.launch(sid)
    make_linked_files(snap, sid, "/root/x", MAX_HARD_LINKS + 1)
    try:
        snap.export(sid, keep=False, timeout=60)
        raise AssertionError("the export of more linked files than the cap succeeded")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
        assert "SNAP_EXPORT_MAX_HARD_LINKS" in (e.details() or ""), e.details()
    # The sandbox is thawed and exports again once below the cap.
    snap.ok(sid, "rm -rf /root/x/l", timeout_seconds=60, rpc_timeout=90)
    snap.export(sid, keep=False, timeout=60)
