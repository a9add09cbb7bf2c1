"""PersistSnapshot into the local store, Connect (created / live / restored),
Delete with and without the snapshot, and two gateways sharing one store."""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
from pathlib import Path

import grpc
import pytest

from tests.lib.client import SandboxClient, new_id, pb, sandbox_client
from tests.lib.gateway import start_gateway
from tests.lib.grpc_clients import rpc_error

PROGRESS_EVERY = 8 * 1024 * 1024
DEFAULT_PREFIX = "sandbox-snapshots/"

CREATED = pb.ConnectResponse.OUTCOME_CREATED
LIVE = pb.ConnectResponse.OUTCOME_LIVE
RESTORED = pb.ConnectResponse.OUTCOME_RESTORED


@pytest.fixture
def snap(gw):
    # Live sandboxes and stored snapshots alike are deleted at the end.
    with sandbox_client(gw, delete_snapshots=True) as c:
        yield c


def store_dir(gw) -> Path:
    """The default local store: $SANDBOX_STATE_DIR/snapshots."""
    return Path(gw.state_dir) / "snapshots"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def temp_files(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return [str(p) for p in directory.rglob("*") if ".tmp-" in p.name]


def test_connect_creates_a_new_sandbox_then_finds_it_live(snap):
    sid = new_id("conn")
    r1 = snap.connect(sid)
    assert r1.outcome == CREATED
    assert r1.sandbox.sandbox_id == sid
    assert sid in snap.ids()
    snap.sh_out(sid, "echo live > /root/mark")
    r2 = snap.connect(sid)
    assert r2.outcome == LIVE
    assert r2.sandbox.sandbox_id == sid
    assert r2.sandbox.created_at_unix_ms == r1.sandbox.created_at_unix_ms
    assert snap.sh_out(sid, "cat /root/mark") == "live\n", "Connect replaced the live sandbox"


def test_persist_writes_the_object_with_its_checksum_and_reports_progress(gw, snap):
    sid = new_id("pers")
    snap.launch(sid)
    snap.sh_out(sid, "head -c 20M /dev/urandom > /root/blob && echo hello > /root/hello && "
                 "sha256sum /root/blob > /root/blob.sum")
    events = snap.persist(sid)
    assert events, "no PersistProgress at all"
    done = events[-1]
    assert done.done, f"the last event is not done: {done}"
    assert all(not e.done for e in events[:-1])
    assert done.object_name == f"{DEFAULT_PREFIX}{sid}.tar"
    assert done.store == "local"

    path = store_dir(gw) / done.object_name
    assert path.is_file(), f"{path} does not exist"
    assert path.stat().st_size == done.bytes_written
    assert sha256_file(path) == done.sha256
    assert not temp_files(store_dir(gw)), "a temporary file was left in the store"

    # > 8 MiB: progress events, increasing, about every 8 MiB.
    progress = [e.bytes_written for e in events[:-1]]
    assert len(progress) >= 2, f"expected progress every 8 MiB of ~20 MiB, got {progress}"
    assert progress == sorted(progress) and len(set(progress)) == len(progress)
    steps = [b - a for a, b in zip([0] + progress, progress)]
    assert all(s >= PROGRESS_EVERY for s in steps), f"progress steps under 8 MiB: {steps}"
    assert all(s < 2 * PROGRESS_EVERY for s in steps), f"progress steps far over 8 MiB: {steps}"
    assert progress[-1] <= done.bytes_written

    # The object is a plain tar of the layer.
    with tarfile.open(path, mode="r:") as tf:
        assert tf.extractfile("root/hello").read() == b"hello\n"

    # Persisting again replaces the object (atomically: still no temp file).
    snap.sh_out(sid, "echo again > /root/hello")
    done2 = snap.persist(sid)[-1]
    assert done2.done and sha256_file(path) == done2.sha256 != done.sha256
    assert not temp_files(store_dir(gw))


def test_connect_restores_after_persist_and_delete(gw, snap):
    sid = new_id("rest")
    assert snap.connect(sid).outcome == CREATED
    snap.sh_out(sid, "mkdir -p /root/data && echo persisted > /root/data/file && rm /etc/hostname")
    done = snap.persist(sid)[-1]
    assert done.done
    resp = snap.delete(sid)
    assert not resp.snapshot_deleted
    assert sid not in snap.ids()
    assert (store_dir(gw) / done.object_name).is_file(), "Delete without delete_snapshot removed it"

    r = snap.connect(sid)
    assert r.outcome == RESTORED
    assert r.sandbox.sandbox_id == sid
    assert snap.sh_out(sid, "cat /root/data/file") == "persisted\n"
    assert snap.exec(sid, ["test", "-e", "/etc/hostname"]).code == 1, "the whiteout was lost"
    # Connected again: live now.
    assert snap.connect(sid).outcome == LIVE


def test_delete_with_snapshot_removes_the_object(gw, snap):
    sid = new_id("dels")
    snap.launch(sid)
    done = snap.persist(sid)[-1]
    path = store_dir(gw) / done.object_name
    assert path.is_file()
    resp = snap.delete(sid, delete_snapshot=True)
    assert resp.snapshot_deleted
    assert not path.exists(), "delete_snapshot=True left the object"
    assert sid not in snap.ids()
    # Neither exists now.
    err = rpc_error(snap.delete, sid, delete_snapshot=True)
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    # And Connect starts from scratch.
    assert snap.connect(sid).outcome == CREATED


def test_delete_snapshot_of_a_sandbox_that_is_gone(gw, snap):
    """Only the stored snapshot exists: Delete succeeds and removes it."""
    sid = new_id("only")
    snap.launch(sid)
    done = snap.persist(sid)[-1]
    snap.delete(sid)
    path = store_dir(gw) / done.object_name
    assert path.is_file()
    resp = snap.delete(sid, delete_snapshot=True)
    assert resp.snapshot_deleted
    assert not path.exists()


@pytest.mark.parametrize("delete_snapshot", [False, True])
def test_delete_of_nothing_is_not_found(snap, delete_snapshot):
    err = rpc_error(snap.delete, new_id("nothing"), delete_snapshot=delete_snapshot)
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    assert "not found" in err.details()


def test_snapshot_prefix_and_directory_come_from_the_environment(gateway_secret):
    store = tempfile.mkdtemp(prefix="sgw-store-")
    g = start_gateway({"SANDBOX_SNAPSHOT_DIR": store,
                       "CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX": "team-a/snaps/"}, secret=gateway_secret)
    c = SandboxClient(g)
    try:
        sid = new_id("pfx")
        c.launch(sid)
        done = c.persist(sid)[-1]
        assert done.object_name == f"team-a/snaps/{sid}.tar"
        path = Path(store) / done.object_name
        assert path.is_file() and sha256_file(path) == done.sha256
        assert not (Path(g.state_dir) / "snapshots" / done.object_name).exists()
        c.delete(sid)
        assert c.connect(sid).outcome == RESTORED
        assert c.delete(sid, delete_snapshot=True).snapshot_deleted
        assert not path.exists()
    finally:
        c.cleanup()
        g.stop()
        shutil.rmtree(store, ignore_errors=True)


def test_two_gateways_share_one_store(gateway_secret):
    store = tempfile.mkdtemp(prefix="sgw-shared-store-")
    g1 = g2 = None
    c1 = c2 = None
    try:
        g1 = start_gateway({"SANDBOX_SNAPSHOT_DIR": store}, secret=gateway_secret)
        g2 = start_gateway({"SANDBOX_SNAPSHOT_DIR": store}, secret=gateway_secret)
        assert g1.state_dir != g2.state_dir and g1.cgroup_group != g2.cgroup_group
        c1, c2 = SandboxClient(g1), SandboxClient(g2)
        sid = new_id("shared")
        c1.launch(sid)
        c1.sh_out(sid, "echo from-gateway-1 > /root/origin && ln -s origin /root/origin-link")
        done = c1.persist(sid)[-1]
        assert done.done and (Path(store) / done.object_name).is_file()

        assert sid not in c2.ids()
        r = c2.connect(sid)
        assert r.outcome == RESTORED
        assert c2.sh_out(sid, "cat /root/origin-link") == "from-gateway-1\n"
        # Each gateway has its own live sandbox now.
        assert sid in c1.ids() and sid in c2.ids()
        # Deleting the snapshot through gateway 2 removes it for both.
        assert c2.delete(sid, delete_snapshot=True).snapshot_deleted
        assert not (Path(store) / done.object_name).exists()
        c1.delete(sid)
        assert c1.connect(sid).outcome == CREATED
    finally:
        for c in (c1, c2):
            if c is not None:
                c.cleanup()
        for g in (g1, g2):
            if g is not None:
                g.stop()
        shutil.rmtree(store, ignore_errors=True)
