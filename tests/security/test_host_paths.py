"""Host-side steps never resolve names a sandbox controls. A snapshot (or a
sandbox before its export) can plant symlinks where the gateway later makes
mount points or writes files — /etc (resolv.conf), /dev, /proc, /root, /tmp,
volume mount points. The sandbox's root is populated from the inside, after
pivot_root, so such a link can only point into the sandbox itself: nothing
appears in, or changes, the host paths they name. And the export walk
survives any depth the kernel allows."""

from __future__ import annotations

import io
import secrets
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.lib.gateway import gateway_client
from tests.lib.security import assert_works, sh


@pytest.fixture
def decoy():
    """An empty host directory the hostile links point at."""
    path = Path(f"/tmp/sgw-decoy-{secrets.token_hex(6)}")
    path.mkdir()
    (path / "etc").mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tar_of_links(links: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("name", ["etc", "dev", "proc", "root", "tmp"])
def test_a_link_in_a_snapshot_cannot_make_launch_write_on_the_host(gateway_secret, decoy, name):
    with gateway_client({"ALLOW_EGRESS": "true"}, secret=gateway_secret) as client:
        sid = f"links-{secrets.token_hex(4)}"
        try:
            client.restore(sid, [tar_of_links({name: f"{decoy}/{name}"})], allow_egress=True)
        except Exception:
            pass  # refusing the snapshot is fine too; writing on the host is not
        assert everything_under(decoy) == ["etc"], everything_under(decoy)


def test_a_sandbox_that_links_etc_to_itself_still_restores(gateway_secret):
    # /etc -> /etc is a loop inside the sandbox: resolv.conf cannot be
    # written there, and nothing is written anywhere else.
    with gateway_client({"ALLOW_EGRESS": "true"}, secret=gateway_secret) as client:
        a = client.launch(allow_egress=True, timeout=30).sandbox_id
        client.ok(a, "rm -rf /etc && ln -s /etc /etc")
        data = client.export(a).data
        client.delete(a)
        b = f"etc-{secrets.token_hex(4)}"
        client.restore(b, [data], allow_egress=True)
        assert client.sh_out(b, "readlink /etc") == "/etc\n"


def test_a_volume_mount_point_behind_a_planted_link_stays_inside(gateway_secret, decoy):
    src = Path(f"/tmp/sgw-volume-{secrets.token_hex(6)}")
    src.mkdir()
    (src / "hello.txt").write_text("from the host\n")
    try:
        env = {"SANDBOX_VOLUME_MOUNTS": f"{src}:/data/sub:ro"}
        with gateway_client(env, secret=gateway_secret) as client:
            sid = f"vol-{secrets.token_hex(4)}"
            client.restore(sid, [tar_of_links({"data": str(decoy)})])
            out = client.sh_out(sid, "cat /data/sub/hello.txt")
            assert out == "from the host\n"
        assert everything_under(decoy) == ["etc"], everything_under(decoy)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def test_a_read_only_volume_is_read_only_and_nosuid_all_the_way_down(gateway_secret):
    src = Path(f"/tmp/sgw-volume-{secrets.token_hex(6)}")
    (src / "nested").mkdir(parents=True)
    try:
        env = {"SANDBOX_VOLUME_MOUNTS": f"{src}:/data:ro"}
        with gateway_client(env, secret=gateway_secret) as client:
            sid = client.launch().sandbox_id
            res = client.sh(sid, "touch /data/x 2>&1; touch /data/nested/y 2>&1; grep ' /data ' /proc/self/mounts")
            assert "Read-only file system" in res.out, res.describe()
            opts = res.out.strip().splitlines()[-1].split()[3].split(",")
            assert {"ro", "nosuid", "nodev"} <= set(opts), opts
        assert list(src.rglob("*")) == [src / "nested"]
    finally:
        shutil.rmtree(src, ignore_errors=True)


@pytest.mark.parametrize("depth", [150, 1500])
def test_deep_trees_export_and_restore_intact(sbx, gateway, depth):
    sid = sbx.launch().sandbox_id
    path = "/tmp/" + "/".join(["d"] * depth)
    sbx.ok(sid, f"mkdir -p {path} && echo bottom > {path}/f")
    data = sbx.export(sid).data
    assert gateway.proc.poll() is None, "the gateway died on export"
    copy = f"{sid}-copy"
    sbx.restore(copy, [data])
    assert sbx.sh_out(copy, f"cat {path}/f") == "bottom\n"
    assert_works(sbx, sid)
    sh(sbx, sid, "rm -rf /tmp/d")
