"""Every wait an exec makes has a deadline, whatever the sandbox or the
exec's client does: a child stopped by code in the sandbox before it has
exec'd, a client that stops reading the output, a Delete of a sandbox
whose exec is unread. The command dies when its timeout says so, the
Delete answers, and other tenants' calls and the gateway's own slots are
not held."""

from __future__ import annotations

import os
import signal
import time

import grpc

from tests.lib.client import pb, sandbox_client
from tests.lib.gateway import cgroup_pids, holder_pids
from tests.lib.procs import wait_until

# Code in the sandbox that stops every process made after it, as soon as
# it exists: pids in a pid namespace come in order, so it sends SIGSTOP to
# the next ones in a tight loop and catches a command's child between its
# clone and its exec.
STOPPER = r"""
import os, signal
me = os.getpid()
while True:
    for p in range(me + 1, me + 64):
        try:
            os.kill(p, signal.SIGSTOP)
        except OSError:
            pass
"""


def unread_exec(sbx, sid: str, script: str, timeout_seconds: int = 0):
    """Starts an Exec whose client never reads a message (the call object;
    cancel it when done)."""
    call = sbx.exec_call(sid, ["sh", "-c", script], timeout_seconds=timeout_seconds, rpc_timeout=120)
    return call


def others(gw, sid: str) -> set[int]:
    """The sandbox's processes but its pid 1."""
    holder = holder_pids(gw, expect=sid).get(sid)
    return cgroup_pids(gw, sid) - {holder}


def test_a_stopped_child_never_holds_the_sandbox_or_the_gateway(procs):
    gw = procs.gateway({"SANDBOX_MAX_CALLS": "32"})
    with sandbox_client(gw) as sbx:
        sid = sbx.launch().sandbox_id
        other = sbx.launch().sandbox_id
        sbx.write_file(sid, "/root/stopper.py", STOPPER.encode())
        sbx.ok(sid, "setsid nohup python3 /root/stopper.py >/dev/null 2>&1 &")
        time.sleep(0.5)
        # The next commands' children are stopped before their exec: each
        # exec still ends, soon after its deadline, with an error.
        for _ in range(2):
            t0 = time.monotonic()
            try:
                events = list(sbx.exec_call(sid, ["true"], timeout_seconds=3, rpc_timeout=40))
                assert events, "the exec ends with an exit event"
            except grpc.RpcError as e:
                assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, e
            assert time.monotonic() - t0 < 30
        # Once the stopper is gone, calls into that sandbox are answered
        # (its pid 1 is not stuck), and another tenant's work goes on.
        for pid in others(gw, sid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"stopper.py" in f.read():
                        os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        sbx.stat(sid, "/root", timeout=30)
        assert sbx.sh_out(other, "echo alive", timeout_seconds=20) == "alive\n"
        t0 = time.monotonic()
        sbx.delete(sid, timeout=30)
        assert time.monotonic() - t0 < 30
        assert sid not in sbx.ids()
        assert wait_until(lambda: not cgroup_pids(gw, sid), 10.0, 0.1)


def test_the_timeout_kills_an_exec_whose_client_does_not_read(procs):
    gw = procs.gateway()
    with sandbox_client(gw) as sbx:
        sid = sbx.launch().sandbox_id
        call = unread_exec(sbx, sid, "sleep 300 & head -c 50000000 /dev/zero", timeout_seconds=5)
        try:
            assert wait_until(lambda: len(others(gw, sid)) >= 2, 20.0, 0.1), "the command runs"
            # Nothing is read; the deadline fires all the same.
            assert wait_until(lambda: not others(gw, sid), 25.0, 0.2), others(gw, sid)
        finally:
            call.cancel()


def test_delete_answers_whatever_an_exec_client_does(procs):
    gw = procs.gateway()
    with sandbox_client(gw) as sbx:
        sid = sbx.launch().sandbox_id
        call = unread_exec(sbx, sid, "sleep 300 & head -c 50000000 /dev/zero")
        try:
            assert wait_until(lambda: len(others(gw, sid)) >= 2, 20.0, 0.1), "the command runs"
            time.sleep(0.5)
            before = sbx.stub.Status(pb.StatusRequest(), metadata=sbx.md, timeout=10).sandboxes
            t0 = time.monotonic()
            sbx.delete(sid, timeout=20)
            assert time.monotonic() - t0 < 20
            assert sid not in sbx.ids()
            status = sbx.stub.Status(pb.StatusRequest(), metadata=sbx.md, timeout=10)
            assert status.sandboxes == before - 1
            assert wait_until(lambda: not cgroup_pids(gw, sid), 10.0, 0.1)
            # The id is free again, for a new sandbox that works.
            sbx.launch(sid)
            assert sbx.sh_out(sid, "echo again", timeout_seconds=20) == "again\n"
        finally:
            call.cancel()
