"""An idle delete that cannot finish holds up nothing else the gateway
does on its own clock: while one sandbox's delete waits for its pid 1 to
exit, another tenant's export is still cut at SANDBOX_EXPORT_FREEZE_SECONDS
(its sandbox thaws) and the health self-check still runs (health follows
the image going and coming back).

The stuck delete: a host process (as an operator's `nsenter -p` would)
starts a child inside the idle sandbox's pid namespace and is then stopped.
The delete's SIGKILL kills that child, but a pid namespace's init cannot
finish exiting before every process of the namespace is reaped, and only
the stopped parent, outside, may reap this one: the holder, and so the
delete waiting for it, stay stuck until that parent runs again."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from tests.lib.client import sandbox_client
from tests.lib.gateway import freezer_state, holder_pids
from tests.lib.grpc_clients import HealthClient, StdProtos
from tests.lib.procs import wait_until

IDLE_TTL_S = 3
FREEZE_S = 3
BIG = "head -c 64M /dev/urandom > /root/big"


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_stuck_idle_delete_stops_neither_freeze_deadlines_nor_health(procs, tmp_path):
    image = tmp_path / "image"
    image.symlink_to("/")
    gw = procs.gateway({
        "SANDBOX_IDLE_TTL": str(IDLE_TTL_S),
        "SANDBOX_EXPORT_FREEZE_SECONDS": str(FREEZE_S),
        "SANDBOX_ROOTFS": str(image),
    })
    health = HealthClient(gw.channel(), StdProtos())
    serving, not_serving = health.std.ServingStatus.SERVING, health.std.ServingStatus.NOT_SERVING
    entered = None
    calls = []
    try:
        with sandbox_client(gw) as sbx:
            # The other tenant: a sandbox with data to export, kept from
            # idling by an exec that runs throughout.
            busy = sbx.launch().sandbox_id
            sbx.ok(busy, BIG)
            calls.append(sbx.exec_call(busy, ["sleep", "50"], rpc_timeout=55))

            # The sandbox whose idle delete gets stuck.
            stuck = sbx.launch().sandbox_id
            holder = holder_pids(gw, expect=stuck)[stuck]
            entered = subprocess.Popen(["nsenter", "-t", str(holder), "-p", "--", "sleep", "300"],
                                       start_new_session=True)
            assert wait_until(lambda: children(entered.pid), 10.0, 0.05), "nsenter started its child"
            os.kill(entered.pid, signal.SIGSTOP)

            assert gw.logs.wait_for(lambda r: r.get("message") == "ending an expired sandbox"
                                    and r.get("sandbox_id") == stuck, IDLE_TTL_S + 15), "the idle delete starts"
            time.sleep(1.5)  # well into the delete, which waits for the holder
            deleted = gw.logs.find(lambda r: r.get("message") == "sandbox deleted" and r.get("sandbox_id") == stuck)
            assert not deleted, "the idle delete is stuck (as this test needs)"

            # (a) An export whose reader stalls freezes `busy`; its
            # deadline still cuts it and the sandbox thaws.
            stream = sbx.export_stream(busy, timeout=50)
            calls.append(stream)
            next(stream)
            thawed = wait_until(lambda: freezer_state(gw, busy) == "THAWED", FREEZE_S + 12, 0.2)
            # (b) The self-check still runs: health follows the image.
            image.unlink()
            down = wait_until(lambda: health.check("").status == not_serving, 10.0, 0.2)
            image.symlink_to("/")
            up = wait_until(lambda: health.check("").status == serving, 10.0, 0.2)
            stalled = ([] if thawed else [f"`{busy}` still {freezer_state(gw, busy)} past its freeze deadline"]) \
                + ([] if down and up else ["health did not follow the image (no self-check ran)"])
            assert not stalled, "while an idle delete was stuck: " + "; ".join(stalled)
            with_deadline = gw.logs.find(lambda r: r.get("sandbox_id") == busy and "frozen too long" in
                                         r.get("message", ""))
            assert with_deadline, "the export was cut by its freeze deadline"
            with pytest.raises(grpc.RpcError) as e:
                for _ in stream:
                    pass
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value

            # Once the stopped parent runs again, the stuck delete ends.
            os.kill(entered.pid, signal.SIGCONT)
            entered.wait(10)
            assert gw.logs.wait_for(lambda r: r.get("message") == "sandbox deleted"
                                    and r.get("sandbox_id") == stuck, 15.0), "the idle delete finished"
            assert busy in sbx.ids()
    finally:
        for call in calls:
            call.cancel()
        if not image.is_symlink():
            image.symlink_to("/")
        if entered is not None and entered.poll() is None:
            os.kill(entered.pid, signal.SIGCONT)
            os.kill(entered.pid, signal.SIGKILL)
            entered.wait(10)
