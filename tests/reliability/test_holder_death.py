"""Should a sandbox's pid 1 (its holder) die (the OOM killer, or a kill
from the host), the gateway notices by itself: the sandbox is reported
dead, with the reason, its processes are killed, and Connect makes it
again."""

from __future__ import annotations

import os
import signal

from tests.lib.client import pb, sandbox_client
from tests.lib.gateway import cgroup_pids, holder_pids
from tests.lib.procs import wait_until


def test_a_dead_holder_is_reported_and_cleaned_and_connect_restores(procs):
    gw = procs.gateway()
    with sandbox_client(gw) as sbx:
        sid = sbx.launch().sandbox_id
        sbx.ok(sid, "setsid nohup sleep 300 >/dev/null 2>&1 &")
        holder = holder_pids(gw, expect=sid)[sid]
        os.kill(holder, signal.SIGKILL)
        assert wait_until(lambda: sbx.get(sid).dead, 10.0, 0.1), "Get says dead"
        info = sbx.get(sid)
        assert "pid 1" in info.dead_reason, info
        assert [s.dead for s in sbx.list() if s.sandbox_id == sid] == [True]
        # Its processes are gone with it, without a Delete.
        assert wait_until(lambda: not cgroup_pids(gw, sid), 10.0, 0.1), cgroup_pids(gw, sid)
        r = sbx.connect(sid, timeout=60)
        assert r.outcome in (pb.ConnectResponse.OUTCOME_RESTORED, pb.ConnectResponse.OUTCOME_CREATED), r
        assert not sbx.get(sid).dead
        assert sbx.sh_out(sid, "echo back", timeout_seconds=20) == "back\n"
