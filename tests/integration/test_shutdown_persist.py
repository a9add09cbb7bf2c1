"""SANDBOX_PERSIST_ON_SHUTDOWN: on SIGTERM every live sandbox is persisted
to the snapshot store (four at a time) within the shutdown grace, each
outcome logged, then deleted; a second gateway on the same store restores
them. Off (explicitly, or by default with no store chosen), nothing is
stored. A grace too short cancels what is under way: the gateway still
exits 0 at once, with no object half written and nothing left on the host."""

from __future__ import annotations

import secrets
import signal
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.lib.client import SandboxClient, pb
from tests.lib.gateway import gateway_leftovers
from tests.lib.peers import running_fake_gcs
from tests.lib.procs import EXIT_MARGIN_S

PREFIX = "sandbox-snapshots/"
RESTORED = pb.ConnectResponse.OUTCOME_RESTORED


def outcomes(gw) -> dict[str, dict]:
    """sandbox id -> its shutdown outcome line."""
    return {r["sandbox_id"]: r for r in gw.logs.find(lambda r: "outcome" in r and "sandbox_id" in r)}


def summary(gw) -> dict:
    lines = gw.logs.find(lambda r: str(r.get("message", "")).startswith("persisted ")
                         and "sandboxes" in r and "failed" in r)
    assert len(lines) == 1, lines
    return lines[0]


def stored_objects(store: Path) -> list[str]:
    """Every file of the local store, temporary ones included."""
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())


def sigterm_and_wait(gw, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    gw.send_signal(signal.SIGTERM)
    rc = gw.wait(timeout=timeout)
    return rc, time.monotonic() - t0


def assert_nothing_left(gw):
    assert gateway_leftovers(gw) == []


# --- persisted, then restored by another gateway ------------------------------------

N_SANDBOXES = 50
GRACE_S = 60


def test_sigterm_persists_fifty_sandboxes_and_another_gateway_restores_each(gateways, tmp_path):
    store = tmp_path / "store"
    gw = gateways.gateway({"SANDBOX_SNAPSHOT_DIR": str(store), "SANDBOX_SHUTDOWN_GRACE_SECONDS": str(GRACE_S)},
                          secret="s")
    assert gw.listening_record["persist_on_shutdown"] is True
    client = SandboxClient(gw)
    ids = [f"drain-{i:02d}" for i in range(N_SANDBOXES)]
    content = {sid: f"{sid} {secrets.token_hex(8)}" for sid in ids}

    def prepare(sid):
        client.launch(sid)
        if ids.index(sid) % 5 == 0:
            # An older state persisted on request: the shutdown's must win.
            client.ok(sid, "echo stale > /root/state.txt")
            client.persist(sid)
        client.ok(sid, f"printf '%s' '{content[sid]}' > /root/state.txt")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(prepare, ids))

    rc, took = sigterm_and_wait(gw, GRACE_S + EXIT_MARGIN_S)
    assert rc == 0
    assert took < GRACE_S
    done = outcomes(gw)
    assert sorted(done) == ids
    for sid in ids:
        rec = done[sid]
        assert rec["outcome"] == "persisted", rec
        assert rec["object"] == f"{PREFIX}{sid}.tar" and rec["bytes"] > 0 and rec["ms"] >= 0, rec
    s = summary(gw)
    assert (s["sandboxes"], s["persisted"], s["failed"], s["deleted"]) == (N_SANDBOXES, N_SANDBOXES, 0, 0), s
    assert stored_objects(store) == sorted(f"{PREFIX}{sid}.tar" for sid in ids)
    assert_nothing_left(gw)

    # Another gateway (its own state directory and cgroups) on the same store.
    gw2 = gateways.gateway({"SANDBOX_SNAPSHOT_DIR": str(store), "SANDBOX_PERSIST_ON_SHUTDOWN": "false"},
                           secret="s")
    assert gw2.state_dir != gw.state_dir
    client2 = SandboxClient(gw2)

    def restore(sid):
        outcome = client2.connect(sid).outcome
        return outcome, client2.ok(sid, "cat /root/state.txt").out

    with ThreadPoolExecutor(max_workers=8) as pool:
        got = dict(zip(ids, pool.map(restore, ids)))
    for sid in ids:
        assert got[sid] == (RESTORED, content[sid]), (sid, got[sid])
    client2.cleanup()


# --- off: nothing stored --------------------------------------------------------------

@pytest.mark.parametrize("explicit", [True, False], ids=["explicit-false", "default-without-a-store"])
def test_sigterm_without_persist_on_shutdown_stores_nothing(gateways, tmp_path, explicit):
    store = tmp_path / "store"
    env = {"SANDBOX_SHUTDOWN_GRACE_SECONDS": "10"}
    if explicit:
        env |= {"SANDBOX_SNAPSHOT_DIR": str(store), "SANDBOX_PERSIST_ON_SHUTDOWN": "false"}
    gw = gateways.gateway(env, secret="s")
    if not explicit:
        store = Path(gw.state_dir) / "snapshots"
    assert gw.listening_record["persist_on_shutdown"] is False
    client = SandboxClient(gw)
    for i in range(3):
        sid = f"off-{i}"
        client.launch(sid)
        client.ok(sid, "echo unsaved > /root/state.txt")
    rc, _ = sigterm_and_wait(gw, 10 + EXIT_MARGIN_S)
    assert rc == 0
    assert not store.exists() or stored_objects(store) == []
    assert outcomes(gw) == {}
    assert not gw.logs.find(lambda r: r.get("message") == "persisting every sandbox before shutdown")
    assert len(gw.logs.find(lambda r: r.get("message") == "sandbox deleted")) == 3
    assert_nothing_left(gw)


# --- the grace ends first ----------------------------------------------------------------

def test_persists_still_running_when_the_grace_ends_are_cancelled(gateways, tmp_path):
    """Three sandboxes of 1 GiB each take seconds to persist on two CPUs
    (tar, sha256, the store's write); a grace of 1 s ends them midway."""
    store = tmp_path / "store"
    gw = gateways.gateway({"SANDBOX_SNAPSHOT_DIR": str(store), "SANDBOX_SHUTDOWN_GRACE_SECONDS": "1"},
                          secret="s")
    client = SandboxClient(gw)
    ids = ["big-0", "big-1", "big-2"]

    def fill(sid):
        client.launch(sid)
        client.sh_out(sid, "head -c 1073741824 /dev/zero > /root/big")

    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(fill, ids))
    rc, took = sigterm_and_wait(gw, 1 + EXIT_MARGIN_S)
    assert rc == 0
    assert took < 1 + 3, f"the gateway took {took:.1f} s to exit with a grace of 1 s"
    done = outcomes(gw)
    assert sorted(done) == ids
    cancelled = [r for r in done.values() if r["outcome"] == "failed"]
    assert cancelled, f"every persist finished within 1 s: {done}"
    for rec in cancelled:
        assert rec["severity"] == "ERROR" and "grace ended" in rec["reason"], rec
        assert "unsaved work is lost" in rec["message"], rec
    persisted = sorted(f"{PREFIX}{sid}.tar" for sid, r in done.items() if r["outcome"] == "persisted")
    s = summary(gw)
    assert (s["sandboxes"], s["persisted"], s["failed"]) == (3, len(persisted), len(cancelled)), s
    # No object of a cancelled persist, nor any temporary file.
    assert stored_objects(store) == persisted
    assert_nothing_left(gw)


def test_with_no_grace_left_no_persist_begins_and_each_sandbox_says_so(gateways, tmp_path):
    store = tmp_path / "store"
    gw = gateways.gateway({"SANDBOX_SNAPSHOT_DIR": str(store), "SANDBOX_SHUTDOWN_GRACE_SECONDS": "0"},
                          secret="s")
    client = SandboxClient(gw)
    for sid in ("late-a", "late-b"):
        client.launch(sid)
    rc, _ = sigterm_and_wait(gw, EXIT_MARGIN_S)
    assert rc == 0
    done = outcomes(gw)
    assert sorted(done) == ["late-a", "late-b"]
    for rec in done.values():
        assert rec["outcome"] == "failed" and "before its persist began" in rec["reason"], rec
    assert summary(gw)["failed"] == 2
    assert stored_objects(store) == []
    assert_nothing_left(gw)


GCS_BUCKET = "drain-bucket"


def test_a_gcs_upload_stalled_at_the_grace_is_cancelled_and_no_object_appears(gateways):
    with running_fake_gcs() as gcs:
        gw = gateways.gateway({"CLOUD_RUN_SANDBOX_GCS_BUCKET": GCS_BUCKET, "STORAGE_EMULATOR_HOST": gcs.host,
                               "SANDBOX_GCS_CHUNK_MB": "1", "SANDBOX_SHUTDOWN_GRACE_SECONDS": "2"}, secret="s")
        assert gw.listening_record["persist_on_shutdown"] is True
        client = SandboxClient(gw)
        client.launch("stalled")
        client.sh_out("stalled", "head -c 3145728 /dev/urandom > /root/blob")
        # Every chunk's PUT waits a minute before the server answers it.
        gcs.control("/_control/fault", {"kind": "slow", "delay": 60, "count": 1000, "methods": ["PUT"]})
        rc, took = sigterm_and_wait(gw, 2 + EXIT_MARGIN_S)
        assert rc == 0
        assert took < 2 + 3, f"the gateway took {took:.1f} s to exit with a grace of 2 s"
        rec = outcomes(gw)["stalled"]
        assert rec["outcome"] == "failed" and "grace ended" in rec["reason"], rec
        with pytest.raises(urllib.error.HTTPError) as e:
            gcs.object_bytes(GCS_BUCKET, f"{PREFIX}stalled.tar")
        assert e.value.code == 404
        assert_nothing_left(gw)


# --- slow sandboxes do not starve the others -----------------------------------------

# A hole of 4 EiB before one byte: its export sends nothing for about a
# minute (the archive skips a hole 2 GiB a step), on a page of disk.
SLOW_FILE = "truncate -s 4E /root/gap && printf X >> /root/gap"
SHARE_GRACE_S = 20


def test_slow_persists_are_cut_at_their_share_and_every_other_sandbox_is_persisted(gateways, tmp_path):
    """Four slow sandboxes use the least disk, so they go first and take all
    four workers. They are stopped at the end of their share of the grace
    (grace x 4 / 10 here) while the six others wait; those are then all
    persisted, and the gateway exits within the grace and its margin."""
    store = tmp_path / "store"
    gw = gateways.gateway({"SANDBOX_SNAPSHOT_DIR": str(store),
                           "SANDBOX_SHUTDOWN_GRACE_SECONDS": str(SHARE_GRACE_S)}, secret="s")
    client = SandboxClient(gw)
    slow = [f"slow-{i}" for i in range(4)]
    others = [f"other-{i}" for i in range(6)]
    for sid in slow:
        client.launch(sid)
        client.ok(sid, SLOW_FILE)
    for sid in others:
        client.launch(sid)
        client.ok(sid, f"head -c 1048576 /dev/urandom > /root/data && echo {sid} > /root/id")
    rc, took = sigterm_and_wait(gw, SHARE_GRACE_S + EXIT_MARGIN_S)
    assert rc == 0
    assert took < SHARE_GRACE_S + EXIT_MARGIN_S, f"the gateway took {took:.1f} s to exit"
    done = outcomes(gw)
    assert sorted(done) == sorted(slow + others)
    for sid in others:
        assert done[sid]["outcome"] == "persisted", done[sid]
    # Cut at their share while others waited; one still running when the
    # queue emptied may use the rest of the grace, and is cut at its end.
    for sid in slow:
        rec = done[sid]
        assert rec["outcome"] == "failed" and ("share" in rec["reason"] or "grace ended" in rec["reason"]), rec
    assert any("share" in done[sid]["reason"] for sid in slow), [done[sid] for sid in slow]
    s = summary(gw)
    assert (s["sandboxes"], s["persisted"], s["failed"]) == (10, 6, 4), s
    assert stored_objects(store) == sorted(f"{PREFIX}{sid}.tar" for sid in others)
    assert_nothing_left(gw)
