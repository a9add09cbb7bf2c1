"""A sandbox's lifetime: its own idle TTL expires it, Extend postpones it,
its most lifetime ends it even while a command runs, and with
persist_on_expiry (the default with a store configured) its snapshot is
left in the store so that Connect restores it. A connect through the shim
renews a live sandbox's idle timer. Out-of-range lifetimes are refused and
change nothing.

Only List is polled while waiting for an expiry: Get renews a sandbox's
idle timer, List does not."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from tests.lib.client import LAUNCH_TIMEOUT_S, SandboxClient, new_id, pb
from tests.lib.gateway import running_gateway
from tests.lib.grpc_clients import rpc_error
from tests.lib.procs import wait_until
from tests.lib.shim import running_shim

MAX_IDLE_TTL = 60
MAX_LIFETIME = 120
# The idler looks once a second: an expiry is due within a TTL plus this.
EXPIRY_SLACK_S = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("lifetime-store")


@pytest.fixture(scope="module")
def client(gateway_secret, store):
    env = {"SANDBOX_SNAPSHOT_DIR": str(store), "SANDBOX_MAX_IDLE_TTL": str(MAX_IDLE_TTL),
           "SANDBOX_MAX_LIFETIME": str(MAX_LIFETIME)}
    with running_gateway(env, secret=gateway_secret, check=True, check_leftovers=True) as gw:
        c = SandboxClient(gw)
        try:
            yield c
        finally:
            c.cleanup()


def launch(client, **kw):
    sid = new_id("life")
    client.created.append(sid)
    return client.stub.Launch(pb.LaunchRequest(sandbox_id=sid, **kw), metadata=client.md, timeout=LAUNCH_TIMEOUT_S)


def listed(client, sid: str) -> bool:
    return sid in client.ids()


def wait_gone(client, sid: str, timeout: float) -> float:
    t0 = time.monotonic()
    assert wait_until(lambda: not listed(client, sid), timeout, interval=0.2), f"{sid} did not expire"
    return time.monotonic() - t0


def extend(client, sid, **kw):
    return client.stub.Extend(pb.ExtendRequest(sandbox_id=sid, **kw), metadata=client.md, timeout=10)


NO = pb.PERSIST_ON_EXPIRY_NO


def test_a_sandbox_idle_past_its_own_ttl_expires_and_a_neighbour_does_not(client):
    info = launch(client, idle_ttl_seconds=2, persist_on_expiry=NO)
    neighbour = launch(client).sandbox_id  # the gateway's TTL: never
    assert info.idle_ttl_seconds == 2
    now_ms = time.time() * 1000
    assert now_ms <= info.expires_at_unix_ms <= now_ms + 2500, info
    assert client.get(neighbour).expires_at_unix_ms == 0
    took = wait_gone(client, info.sandbox_id, 2 + EXPIRY_SLACK_S)
    assert took >= 1.0, took
    assert rpc_error(client.get, info.sandbox_id).code() == grpc.StatusCode.NOT_FOUND
    assert listed(client, neighbour)


def test_extend_postpones_the_idle_expiry(client):
    sid = launch(client, idle_ttl_seconds=2, persist_on_expiry=NO).sandbox_id
    got = extend(client, sid, idle_ttl_seconds=7)
    assert got.idle_ttl_seconds == 7
    assert got.expires_at_unix_ms >= time.time() * 1000 + 5000, got
    time.sleep(4)  # past the launch's TTL
    assert listed(client, sid)
    wait_gone(client, sid, 7 + EXPIRY_SLACK_S)


def shim_expiries(shim) -> dict[str, int]:
    r = shim.request("GET", "/sandboxes")  # List: renews nothing
    assert r.status == 200, (r.status, r.body)
    return {s["sandbox_id"]: s["expires_at_ms"] for s in r.json()["sandboxes"]}


def test_a_connect_through_the_shim_renews_the_idle_ttl(client):
    kept = launch(client, idle_ttl_seconds=2, persist_on_expiry=NO).sandbox_id
    left = launch(client, idle_ttl_seconds=2, persist_on_expiry=NO).sandbox_id
    with running_shim(client.gw) as shim:
        before = shim_expiries(shim)[kept]
        time.sleep(1)
        r = shim.request("POST", f"/sandboxes/{kept}/connect")
        assert r.status == 200 and r.json()["outcome"] == "live", (r.status, r.body)
        after = shim_expiries(shim)[kept]
        assert after >= before + 800, (before, after)
        # Kept alive past several TTLs by connects alone; its neighbour,
        # never connected, expires meanwhile.
        t_end = time.monotonic() + 3 * 2 + EXPIRY_SLACK_S
        while time.monotonic() < t_end:
            r = shim.request("POST", f"/sandboxes/{kept}/connect")
            assert r.status == 200 and r.json()["outcome"] == "live", (r.status, r.body)
            time.sleep(0.5)
        now = shim_expiries(shim)
        assert kept in now and left not in now, now
        # Without connects it expires too.
        took = wait_gone(client, kept, 2 + EXPIRY_SLACK_S)
        assert took >= 1.0, took


def test_extend_sets_a_new_end_of_life(client):
    sid = launch(client, max_lifetime_seconds=2, persist_on_expiry=NO).sandbox_id
    got = extend(client, sid, max_lifetime_seconds=8)
    assert got.max_lifetime_seconds == 8
    time.sleep(4)
    assert listed(client, sid)
    wait_gone(client, sid, 8 + EXPIRY_SLACK_S)


def test_max_lifetime_ends_even_a_busy_sandbox(client):
    sid = launch(client, max_lifetime_seconds=3, persist_on_expiry=NO).sandbox_id
    done = {}

    def busy():
        try:
            done["res"] = client.sh(sid, "sleep 60", timeout_seconds=90, rpc_timeout=120)
        except grpc.RpcError as e:
            done["err"] = e

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    try:
        took = wait_gone(client, sid, 3 + EXPIRY_SLACK_S)
        assert took < 3 + EXPIRY_SLACK_S
        t.join(timeout=20)
        assert not t.is_alive(), "the command outlived its sandbox"
        res = done.get("res")
        assert "err" in done or (res is not None and res.code != 0), done
    finally:
        t.join(timeout=1)


def test_persist_on_expiry_leaves_a_snapshot_that_connect_restores(client, store):
    sid = launch(client, idle_ttl_seconds=2).sandbox_id  # a store is configured: persisted by default
    client.ok(sid, "echo kept-across-expiry > /root/work.txt")
    wait_gone(client, sid, 2 + EXPIRY_SLACK_S + 10)
    objects = [p for p in store.rglob("*.tar") if p.name == f"{sid}.tar"]
    assert objects, sorted(str(p) for p in store.rglob("*"))
    recs = client.gw.logs.find(lambda r: r.get("sandbox_id") == sid and r.get("outcome") == "persisted")
    assert recs and recs[0]["reason"] == "idle", recs
    resp = client.connect(sid)
    assert resp.outcome == pb.ConnectResponse.OUTCOME_RESTORED, resp
    assert client.sh_out(sid, "cat /root/work.txt") == "kept-across-expiry\n"
    client.delete(sid, delete_snapshot=True)


def test_persist_off_leaves_no_snapshot(client, store):
    sid = launch(client, idle_ttl_seconds=1, persist_on_expiry=NO).sandbox_id
    wait_gone(client, sid, 1 + EXPIRY_SLACK_S)
    assert not [p for p in store.rglob("*") if sid in p.name]


@pytest.mark.parametrize("kw, field, maximum", [
    ({"idle_ttl_seconds": MAX_IDLE_TTL + 1}, "idle_ttl_seconds", MAX_IDLE_TTL),
    ({"idle_ttl_seconds": 4294967295}, "idle_ttl_seconds", MAX_IDLE_TTL),
    ({"max_lifetime_seconds": MAX_LIFETIME + 1}, "max_lifetime_seconds", MAX_LIFETIME),
    ({"max_lifetime_seconds": 4294967295}, "max_lifetime_seconds", MAX_LIFETIME),
])
def test_huge_lifetimes_are_refused_at_launch_and_by_extend(client, kw, field, maximum):
    e = rpc_error(launch, client, **kw)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.details() and str(maximum) in e.details(), e
    sid = launch(client, idle_ttl_seconds=30, max_lifetime_seconds=60, persist_on_expiry=NO).sandbox_id
    before = client.get(sid)
    e = rpc_error(extend, client, sid, **kw)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.details(), e
    after = client.get(sid)
    assert (after.idle_ttl_seconds, after.max_lifetime_seconds) == (before.idle_ttl_seconds,
                                                                    before.max_lifetime_seconds)
    assert after.expires_at_unix_ms - before.expires_at_unix_ms < 5000
    client.delete(sid)


def test_extend_of_an_unknown_sandbox_is_not_found(client):
    assert rpc_error(extend, client, "no-such-sandbox", idle_ttl_seconds=5).code() == grpc.StatusCode.NOT_FOUND
    assert rpc_error(extend, client, "--evil", idle_ttl_seconds=5).code() == grpc.StatusCode.INVALID_ARGUMENT
