"""The freeze of an export is counted and bounded: concurrent exports of a
sandbox share one freeze (it thaws when the last ends, so none reads a
running sandbox); a stalled reader cannot keep a sandbox frozen beyond
SANDBOX_EXPORT_FREEZE_SECONDS; Delete stops the exports in flight, thaws
and answers promptly."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from tests.lib.client import new_id, sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.snapshots import open_tar

FREEZE_S = 3
BIG = "head -c 64M /dev/urandom > /root/big"


@pytest.fixture(scope="module")
def fgw(gateway_secret):
    with running_gateway({"SANDBOX_EXPORT_FREEZE_SECONDS": str(FREEZE_S)}, secret=gateway_secret, check=True) as gw:
        yield gw


@pytest.fixture
def client(fgw):
    with sandbox_client(fgw) as c:
        yield c


def stalled_export(client, sid):
    """An export whose reader takes one chunk and then stops reading."""
    stream = client.export_stream(sid, timeout=120)
    next(stream)
    return stream


def test_a_stalled_reader_cannot_keep_the_sandbox_frozen(client):
    sid = new_id("stall")
    client.launch(sid)
    client.ok(sid, BIG)
    stream = stalled_export(client, sid)
    start = time.monotonic()
    # Frozen, an exec cannot start; after the bound it runs again.
    assert client.sh_out(sid, "echo thawed", timeout_seconds=60) == "thawed\n"
    assert time.monotonic() - start < FREEZE_S + 20
    with pytest.raises(grpc.RpcError) as e:
        for _ in stream:
            pass
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
    stream.cancel()


def test_delete_stops_a_stalled_export_and_frees_the_id(client):
    sid = new_id("stall-del")
    client.launch(sid)
    client.ok(sid, BIG)
    stream = stalled_export(client, sid)
    start = time.monotonic()
    client.delete(sid, timeout=30)
    assert time.monotonic() - start < 10
    client.launch(sid)  # the id is free again
    stream.cancel()


def test_overlapping_exports_share_one_freeze(client):
    """A writer rewrites a 32 MiB file in place, front to back, with the
    next letter whenever it runs. One export reads slowly to the end;
    another starts meanwhile and is abandoned: the complete one holds a
    state that existed — a newer letter followed by the one before it, never
    an older letter before a newer one (which only a read racing the writer
    produces) — because the abandoned export's end did not thaw the sandbox
    under the other."""
    sid = new_id("overlap")
    client.launch(sid)
    client.ok(sid, "head -c 32M /dev/zero | tr '\\0' A > /root/f")
    client.ok(sid, "nohup sh -c 'for v in B C D E F G H I J K L M N O P Q R S T U V W X Y Z; do "
                   "head -c 32M /dev/zero | tr \"\\\\0\" $v | dd of=/root/f bs=1M conv=notrunc 2>/dev/null; "
                   "done' >/dev/null 2>&1 &")
    time.sleep(0.3)
    complete = client.export_stream(sid, timeout=120)
    pieces = [next(complete).data]
    abandoned = client.export_stream(sid, timeout=120)
    next(abandoned)
    abandoned.cancel()
    time.sleep(1.0)  # were the sandbox thawed now, the writer would run
    for chunk in complete:
        pieces.append(chunk.data)
        time.sleep(0.005)
    tar = open_tar(b"".join(pieces))
    member = next(m for m in tar.getmembers() if m.name.endswith("root/f"))
    data = tar.extractfile(member).read()
    assert len(data) == 32 << 20
    runs = [data[0]]
    for i in range(0, len(data), 4096):
        if data[i] != runs[-1]:
            runs.append(data[i])
    assert len(runs) <= 2 and runs == sorted(runs, reverse=True), [chr(r) for r in runs]


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.6])
def test_a_persist_racing_delete_with_its_snapshot_leaves_no_snapshot(client, delay):
    from tests.lib.client import pb
    sid = new_id("race")
    client.launch(sid)
    client.ok(sid, BIG)
    outcome = {}

    def persist():
        try:
            outcome["events"] = client.persist(sid, timeout=120)
        except grpc.RpcError as e:
            outcome["error"] = e.code()

    t = threading.Thread(target=persist)
    t.start()
    time.sleep(delay)
    client.delete(sid, delete_snapshot=True, timeout=60)
    t.join(120)
    # Whatever the persist did, no snapshot survives the delete.
    r = client.connect(sid)
    assert r.outcome == pb.ConnectResponse.OUTCOME_CREATED, (r.outcome, outcome)


def test_an_export_that_runs_out_of_files_fails_and_keeps_the_stored_snapshot(fgw, client):
    """EMFILE in the middle of a persist fails it clearly; the snapshot
    stored before stays intact and restorable (never replaced by a partial
    one)."""
    import os
    import subprocess
    from tests.lib.client import pb
    sid = new_id("emfile")
    client.launch(sid)
    client.ok(sid, "echo first > /root/state")
    assert client.persist(sid)[-1].done
    client.ok(sid, "echo second > /root/state && mkdir -p /root/" + "/".join(["d"] * 100))
    open_now = len(os.listdir(f"/proc/{fgw.pid}/fd"))
    soft, hard = (int(v) for v in subprocess.run(
        ["prlimit", f"--pid={fgw.pid}", "--nofile", "--raw", "--noheadings", "--output=SOFT,HARD"],
        check=True, capture_output=True, text=True).stdout.split())
    # Lower the soft limit only (raising a hard limit back needs a privilege).
    subprocess.run(["prlimit", f"--pid={fgw.pid}", f"--nofile={open_now + 60}:{hard}"], check=True)
    try:
        with pytest.raises(grpc.RpcError) as e:
            client.persist(sid)
        assert e.value.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL), e.value
    finally:
        subprocess.run(["prlimit", f"--pid={fgw.pid}", f"--nofile={soft}:{hard}"], check=True)
    client.delete(sid)
    r = client.connect(sid)
    assert r.outcome == pb.ConnectResponse.OUTCOME_RESTORED
    assert client.sh_out(sid, "cat /root/state") == "first\n"
