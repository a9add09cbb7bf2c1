"""Holes a sandbox makes cost its export nothing, and an export that finds
nothing to send still stops when told: a file of 4 EiB that is all hole
exports at once and restores with its size and its zeros; an export whose
walk sends nothing for a long time (a hole of EiBs between two data
regions, which the archive skips 2 GiB a step) ends promptly when its
client cancels it, and when it has kept the sandbox frozen for
SANDBOX_EXPORT_FREEZE_SECONDS; either way the sandbox is thawed."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from tests.lib.client import new_id, sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.snapshots import chunks_of, open_tar

EIB = 1 << 60
FREEZE_S = 3
# A hole of 4 EiB, then one byte: the archive is handed the hole 2 GiB at a
# time, about a minute of walking that sends nothing.
INNER_HOLE = "truncate -s 4E /root/gap && printf X >> /root/gap"


@pytest.fixture(scope="module")
def hgw(gateway_secret):
    with running_gateway({"SANDBOX_EXPORT_FREEZE_SECONDS": str(FREEZE_S)}, secret=gateway_secret,
                         check=True) as gw:
        yield gw


@pytest.fixture
def client(hgw):
    with sandbox_client(hgw) as c:
        yield c


def test_a_4_eib_hole_exports_at_once_and_restores_as_zeros(client):
    sid = new_id("hole")
    client.launch(sid)
    client.ok(sid, "truncate -s 4E /root/hole && printf data > /root/small")
    t0 = time.monotonic()
    ex = client.export(sid, timeout=30)
    took = time.monotonic() - t0
    assert took < 20, f"the export of a 4 EiB hole took {took:.1f} s"
    assert len(ex.data) < 64 * 1024, len(ex.data)
    member = next(m for m in open_tar(ex.data).getmembers() if m.name.endswith("root/hole"))
    assert member.size == 4 * EIB and member.sparse is not None, member
    copy = new_id("hole-copy")
    client.restore(copy, chunks_of(ex.data), timeout=30)
    out = client.sh_out(copy, "stat -c '%s %b' /root/hole; head -c 16 /root/hole | od -An -tx1;"
                              "tail -c 16 /root/hole | od -An -tx1; cat /root/small")
    lines = out.split("\n")
    size, blocks = lines[0].split()
    assert int(size) == 4 * EIB and int(blocks) == 0, out
    assert lines[1].split() == ["00"] * 16 and lines[2].split() == ["00"] * 16, out
    assert lines[3] == "data", out


def thawed_within(client, sid, seconds: float) -> float:
    """Seconds until an exec runs in `sid` (frozen, it cannot start)."""
    t0 = time.monotonic()
    assert client.sh_out(sid, "echo thawed", timeout_seconds=int(seconds)) == "thawed\n"
    return time.monotonic() - t0


def test_a_client_cancelling_an_export_that_sends_nothing_thaws_the_sandbox(client):
    sid = new_id("hole-cancel")
    client.launch(sid)
    client.ok(sid, INNER_HOLE)
    stream = client.export_stream(sid, timeout=120)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(_drain(stream)), daemon=True)
    reader.start()
    time.sleep(1.0)  # the walk is in the hole, frozen, sending nothing
    assert reader.is_alive(), f"the export ended on its own: {got}"
    stream.cancel()
    reader.join(10)
    assert not reader.is_alive()
    took = thawed_within(client, sid, 30)
    assert took < 15, f"the sandbox stayed frozen {took:.1f} s after the export was cancelled"
    # The gateway holds no export any more: another one (of a sandbox
    # without the hole) runs at once.
    other = new_id("hole-after")
    client.launch(other)
    client.ok(other, "echo x > /root/x")
    client.export(other, timeout=30)


def _drain(stream) -> list:
    out = []
    try:
        for chunk in stream:
            out.append(chunk)
    except grpc.RpcError as e:
        out.append(e.code())
    return out


def test_the_freeze_deadline_stops_an_export_that_sends_nothing(client):
    sid = new_id("hole-freeze")
    client.launch(sid)
    client.ok(sid, INNER_HOLE)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        client.export(sid, timeout=120)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
    assert "frozen too long" in (e.value.details() or ""), e.value
    assert time.monotonic() - t0 < FREEZE_S + 20
    took = thawed_within(client, sid, 30)
    assert took < 15, f"the sandbox stayed frozen {took:.1f} s past the freeze deadline"
    # And Delete answers at once (the export has let go of the sandbox).
    t1 = time.monotonic()
    client.delete(sid)
    assert time.monotonic() - t1 < 10
