"""Host volumes attacked from inside a sandbox: attacks that still win.

Each test asserts the secure behaviour, so it fails while the attack
works (marked `finding`). What the host sees is checked from the host's
side.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from tests.lib.gateway import gateway_client
from tests.lib.procs import ProcessStartError




@pytest.fixture
def host_dir():
    """A host directory no sandbox may see: a tmpfs of its own (overlayfs
    does not show mounts stacked on its lower directory, so with
    SANDBOX_ROOTFS=/ it is not in the image either), readable by all, with
    a file and a world-writable subdirectory."""
    path = Path(f"/tmp/sgw-hostdir-{secrets.token_hex(6)}")
    path.mkdir(mode=0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "sgw-hostdir", str(path)], check=True)
    token = "HOST-ONLY-" + secrets.token_hex(8)
    try:
        (path / "canary").write_text(token + "\n")
        (path / "canary").chmod(0o644)
        (path / "open").mkdir()
        (path / "open").chmod(0o1777)
        yield path, token
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


@pytest.mark.finding("V1")
def test_a_missing_nested_volume_cannot_be_pointed_at_a_host_directory(shared, host_dir, gateway_secret):
    """The attack: SANDBOX_VOLUME_MOUNTS names an inner volume below an
    outer one whose host path does not exist yet (skipped with a warning,
    so the nesting check never sees it). A sandbox plants a symlink there,
    through the outer volume, to a host directory of its choice. At the
    next start the inner path resolves (realpath) to that directory, which
    no longer lies inside the outer volume, and every sandbox gets it bound
    read-write. The gateway must refuse that layout (or never bind the
    target): no sandbox may see the host directory."""
    target, token = host_dir
    env = {"SANDBOX_VOLUME_MOUNTS": f"{shared}:/shared,{shared}/cache:/cache"}
    # Refused as written, while the inner path is missing...
    with pytest.raises(ProcessStartError) as e:
        with gateway_client(env, secret=gateway_secret):
            pass
    assert "nest" in str(e.value), e.value
    # ... and once a sandbox (through an outer volume of another layout)
    # has planted the link there: never bound.
    (shared / "cache").symlink_to(target)
    try:
        with gateway_client(env, secret=gateway_secret) as sbx:
            sid = sbx.launch().sandbox_id
            r = sbx.sh(sid, "cat /cache/canary; echo sandbox > /cache/open/written; echo rc=$?")
    except ProcessStartError:
        return  # refused at start: fine
    assert token not in r.out, f"a sandbox reads a host directory outside every volume: {r.describe()}"
    assert not (target / "open" / "written").exists(), "a sandbox wrote into a host directory outside every volume"


@pytest.mark.finding("V2")
def test_a_volume_mount_point_planted_through_proc_never_reaches_the_host(shared, gateway_secret):
    """The attack: a sandbox replaces the parent of a volume's mount point
    (/vols of /vols/data, a directory of its own layer) with a symlink to
    /proc/self/fd/<n>/<host dir>, and its layer is snapshotted and
    restored (as Connect does). The launching helper makes the mount
    point in the sandbox's root after /proc is mounted there, as the host's
    root and before entering the user namespace: the magic link leads to
    the image's detached clone, the host's real root filesystem. With
    SANDBOX_USERNS=false (the image is not idmapped) the helper creates
    `data` in any host directory the sandbox names, owned by host root (a
    file volume's mount point: an empty file anywhere). A planted link must
    resolve inside the sandbox: nothing appears on the host."""
    target = Path(f"/tmp/sgw-target-{secrets.token_hex(6)}")
    target.mkdir(mode=0o755)
    try:
        env = {"SANDBOX_VOLUME_MOUNTS": f"{shared}:/vols/data", "SANDBOX_USERNS": "false"}
        with gateway_client(env, secret=gateway_secret) as sbx:
            sid = sbx.launch().sandbox_id
            assert sbx.sh_out(sid, "mv /vols /vols.old && echo moved") == "moved\n"
            for n in range(3, 11):
                sbx.sh_out(sid, f"ln -sfn /proc/self/fd/{n}{target} /vols && echo ok")
                data = sbx.export(sid).data
                try:
                    sbx.restore(f"{sid}-{n}", [data])
                except grpc.RpcError:
                    pass  # the launch failing is fine; what it left on the host is not
                assert list(target.iterdir()) == [], f"fd {n}: the helper made {list(target.iterdir())} on the host"
    finally:
        shutil.rmtree(target, ignore_errors=True)
