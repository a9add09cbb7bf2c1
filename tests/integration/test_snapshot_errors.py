"""Errors of the snapshot methods: unknown sandboxes, invalid ids, malformed
Restore streams, and a client that cancels an export mid-stream (the sandbox
must not stay frozen)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import grpc
import pytest

from tests.lib.client import new_id, pb
from tests.lib.gateway import freezer_state
from tests.lib.grpc_clients import RPC_TIMEOUT_S, rpc_error
from tests.lib.procs import wait_until
from tests.lib.snapshots import chunks_of

INVALID_IDS = ["", "-leading-dash", "_leading", "has/slash", "../escape", "has space",
               "dot.ted", "x" * 65, "ünicode"]


def store_files(gw) -> list[str]:
    d = Path(gw.state_dir) / "snapshots"
    return sorted(str(p) for p in d.rglob("*") if p.is_file()) if d.is_dir() else []


def test_export_of_an_unknown_sandbox_is_not_found(snap):
    err = rpc_error(snap.export, new_id("ghost"), timeout=RPC_TIMEOUT_S)
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    assert "not found" in err.details()


def test_persist_of_an_unknown_sandbox_is_not_found_and_stores_nothing(gw, snap):
    before = store_files(gw)
    err = rpc_error(snap.persist, new_id("ghost"), timeout=RPC_TIMEOUT_S)
    assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
    assert store_files(gw) == before, "a failed persist left a file in the store"


@pytest.mark.parametrize("bad_id", INVALID_IDS, ids=repr)
def test_invalid_ids_are_invalid_argument(snap, bad_id):
    calls = {
        "ExportSnapshot": lambda: snap.export(bad_id, timeout=RPC_TIMEOUT_S),
        "PersistSnapshot": lambda: snap.persist(bad_id, timeout=RPC_TIMEOUT_S),
        "Connect": lambda: snap.connect(bad_id),
        "Restore": lambda: snap.restore(bad_id, [b""], timeout=RPC_TIMEOUT_S),
        "Delete": lambda: snap.delete(bad_id, delete_snapshot=True),
    }
    wrong = {}
    for name, call in calls.items():
        err = rpc_error(call)
        if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
            wrong[name] = f"{err.code().name}: {err.details()}"
        else:
            assert "id" in err.details(), f"{name}: the message does not name the id: {err.details()}"
    assert not wrong, f"not INVALID_ARGUMENT for {bad_id!r}: {wrong}"
    assert bad_id not in snap.ids()


def test_export_with_an_unknown_compression_is_invalid_argument(snap):
    sid = new_id("comp")
    snap.launch(sid)
    err = rpc_error(snap.export, sid, compression=17, timeout=RPC_TIMEOUT_S)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "compression" in err.details()
    assert freezer_state(snap.gw, sid) in (None, "THAWED")


def test_restore_whose_first_message_is_not_a_header_is_invalid_argument(snap):
    def reqs():
        yield pb.RestoreRequest(tar_chunk=b"\0" * 1024)
    err = rpc_error(snap.stub.Restore, reqs(), metadata=snap.md, timeout=RPC_TIMEOUT_S)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "header" in err.details()


def test_restore_with_a_second_header_is_invalid_argument_and_leaves_nothing(gw, snap):
    sid = new_id("twohdr")
    def reqs():
        yield pb.RestoreRequest(header=pb.RestoreHeader(sandbox_id=sid))
        yield pb.RestoreRequest(header=pb.RestoreHeader(sandbox_id=sid))
    err = rpc_error(snap.stub.Restore, reqs(), metadata=snap.md, timeout=RPC_TIMEOUT_S)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "header" in err.details()
    assert sid not in snap.ids()
    assert wait_until(lambda: not gw.leftovers(), timeout=10), gw.leftovers()


def test_restore_over_a_live_sandbox_is_already_exists(snap):
    sid = new_id("dup")
    snap.launch(sid)
    snap.sh_out(sid, "echo keep > /root/keep")
    ex = snap.export(sid)
    err = rpc_error(snap.restore, sid, chunks_of(ex.data), timeout=60)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err.details()
    assert snap.sh_out(sid, "cat /root/keep") == "keep\n", "the live sandbox was disturbed"


def test_cancelled_export_leaves_the_sandbox_thawed(gw, snap):
    sid = new_id("cancel")
    snap.launch(sid)
    # Enough data that the export cannot finish into transport buffers while
    # the client does not read.
    snap.sh_out(sid, "head -c 48M /dev/urandom > /root/blob")
    assert freezer_state(gw, sid) == "THAWED"

    stream = snap.export_stream(sid, pb.COMPRESSION_NONE, timeout=120)
    first = next(stream)
    assert first.data and not first.last
    # Mid-stream (the client holds back), the sandbox is frozen.
    assert wait_until(lambda: freezer_state(gw, sid) == "FROZEN", timeout=10), \
        f"not frozen during the export: {freezer_state(gw, sid)}"
    stream.cancel()
    with contextlib.suppress(grpc.RpcError):
        for _ in stream:
            pass

    assert wait_until(lambda: freezer_state(gw, sid) == "THAWED", timeout=30), \
        f"the sandbox stayed {freezer_state(gw, sid)} after the client cancelled the export"
    res = snap.exec(sid, ["sh", "-c", "echo alive; wc -c < /root/blob"], timeout_seconds=30)
    assert res.code == 0 and res.out.split() == ["alive", str(48 * 1024 * 1024)], res.describe()
    # And a full export works afterwards.
    ex = snap.export(sid, keep=False)
    assert ex.last.sha256 == ex.sha256 and ex.received_bytes > 48 * 1024 * 1024
    assert freezer_state(gw, sid) == "THAWED"


def test_export_leaves_the_sandbox_thawed(snap):
    sid = new_id("thaw")
    snap.launch(sid)
    snap.export(sid)
    assert freezer_state(snap.gw, sid) == "THAWED"
    assert snap.exec(sid, ["true"], timeout_seconds=30).code == 0
