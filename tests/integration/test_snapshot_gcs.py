"""PersistSnapshot and Connect with the Google Cloud Storage store, against
tests/gcs/fake_gcs.py (the GCS JSON API on loopback, with faults on demand):
the object is written under the names existing deployments use, survives
injected faults, carries a sandbox across two gateway processes, and goes
away with Delete(delete_snapshot=True)."""

import hashlib
import urllib.error

import grpc
import pytest

from tests.lib.client import SandboxClient, pb
from tests.lib.gateway import running_gateway
from tests.lib.peers import running_fake_gcs

SECRET = "gcs-test-secret"
BUCKET = "snapshots-bucket"


@pytest.fixture()
def fake_gcs():
    with running_fake_gcs() as g:
        yield g


def control(gcs, path, body=None):
    return gcs.control(path, body)


def object_bytes(gcs, name):
    return gcs.object_bytes(BUCKET, name)


def gcs_env(gcs):
    return {"CLOUD_RUN_SANDBOX_GCS_BUCKET": BUCKET, "STORAGE_EMULATOR_HOST": gcs.host,
            "SANDBOX_GCS_CHUNK_MB": "1", "SANDBOX_GCS_RETRY_SECONDS": "20"}


def stub(gw):
    return SandboxClient(gw).stub


def run(gw, sid, argv):
    res = SandboxClient(gw).exec(sid, argv)
    return res.stdout, res.code


def persist(gw, sid):
    return SandboxClient(gw).persist(sid, timeout=120)


def test_persist_writes_the_object_existing_backends_read_and_connect_restores_it(fake_gcs):
    with running_gateway(gcs_env(fake_gcs), secret=SECRET) as gw:
        s = stub(gw)
        s.Launch(pb.LaunchRequest(sandbox_id="gcs1"), metadata=gw.auth_metadata(), timeout=30)
        # 3 MiB of random data: several 1 MiB chunks of the resumable upload.
        _, code = run(gw, "gcs1", ["sh", "-c", "echo kept > /root/note; head -c 3145728 /dev/urandom > /root/blob"])
        assert code == 0
        want, _ = run(gw, "gcs1", ["sha256sum", "/root/blob"])
        events = persist(gw, "gcs1")
        done = events[-1]
        assert done.done and done.store == "gcs"
        assert done.object_name == "sandbox-snapshots/gcs1.tar"
        data = object_bytes(fake_gcs, done.object_name)
        assert len(data) == done.bytes_written
        assert hashlib.sha256(data).hexdigest() == done.sha256
        s.Delete(pb.DeleteRequest(sandbox_id="gcs1"), metadata=gw.auth_metadata(), timeout=30)
        r = s.Connect(pb.ConnectRequest(sandbox_id="gcs1"), metadata=gw.auth_metadata(), timeout=120)
        assert r.outcome == pb.ConnectResponse.OUTCOME_RESTORED
        assert run(gw, "gcs1", ["cat", "/root/note"]) == (b"kept\n", 0)
        assert run(gw, "gcs1", ["sha256sum", "/root/blob"])[0] == want


def test_upload_survives_injected_faults(fake_gcs):
    with running_gateway(gcs_env(fake_gcs), secret=SECRET) as gw:
        stub(gw).Launch(pb.LaunchRequest(sandbox_id="gcs2"), metadata=gw.auth_metadata(), timeout=30)
        run(gw, "gcs2", ["sh", "-c", "head -c 4194304 /dev/urandom > /root/blob"])
        control(fake_gcs, "/_control/fault", {"kind": "status", "code": 503, "count": 2, "methods": ["PUT"]})
        control(fake_gcs, "/_control/fault", {"kind": "drop", "count": 1, "methods": ["PUT"]})
        done = persist(gw, "gcs2")[-1]
        stats = control(fake_gcs, "/_control/stats")
        assert stats.get("faults_fired", 0) >= 3, stats
        data = object_bytes(fake_gcs, done.object_name)
        assert hashlib.sha256(data).hexdigest() == done.sha256


def test_an_outage_longer_than_the_retry_budget_fails_clearly_and_leaves_no_object(fake_gcs):
    env = gcs_env(fake_gcs) | {"SANDBOX_GCS_RETRY_SECONDS": "2"}
    with running_gateway(env, secret=SECRET) as gw:
        stub(gw).Launch(pb.LaunchRequest(sandbox_id="gcs3"), metadata=gw.auth_metadata(), timeout=30)
        control(fake_gcs, "/_control/fault", {"kind": "status", "code": 503, "count": 100000})
        with pytest.raises(grpc.RpcError) as e:
            persist(gw, "gcs3")
        assert e.value.code() != grpc.StatusCode.OK
        assert "gcs3" in e.value.details() or "sandbox-snapshots" in e.value.details()
        control(fake_gcs, "/_control/reset", {})
        with pytest.raises(urllib.error.HTTPError) as h:
            object_bytes(fake_gcs, "sandbox-snapshots/gcs3.tar")
        assert h.value.code == 404
        # The sandbox is thawed and usable after the failure.
        assert run(gw, "gcs3", ["echo", "alive"]) == (b"alive\n", 0)


def test_a_second_gateway_restores_what_the_first_persisted_and_delete_removes_it(fake_gcs):
    with running_gateway(gcs_env(fake_gcs), secret=SECRET) as gw1:
        stub(gw1).Launch(pb.LaunchRequest(sandbox_id="gcs4"), metadata=gw1.auth_metadata(), timeout=30)
        run(gw1, "gcs4", ["sh", "-c", "echo from-gateway-1 > /root/who"])
        persist(gw1, "gcs4")
    with running_gateway(gcs_env(fake_gcs), secret=SECRET) as gw2:
        s = stub(gw2)
        r = s.Connect(pb.ConnectRequest(sandbox_id="gcs4"), metadata=gw2.auth_metadata(), timeout=120)
        assert r.outcome == pb.ConnectResponse.OUTCOME_RESTORED
        assert run(gw2, "gcs4", ["cat", "/root/who"]) == (b"from-gateway-1\n", 0)
        resp = s.Delete(pb.DeleteRequest(sandbox_id="gcs4", delete_snapshot=True), metadata=gw2.auth_metadata(),
                        timeout=30)
        assert resp.snapshot_deleted
        with pytest.raises(urllib.error.HTTPError) as h:
            object_bytes(fake_gcs, "sandbox-snapshots/gcs4.tar")
        assert h.value.code == 404
        r = s.Connect(pb.ConnectRequest(sandbox_id="gcs4"), metadata=gw2.auth_metadata(), timeout=60)
        assert r.outcome == pb.ConnectResponse.OUTCOME_CREATED
