"""Execs whose clients stop reading cost the gateway a bounded amount each
and a named total together.

A client starts many Execs of commands that print without end, reads a
few messages of each (so that their buffers grow as for a fast reader),
then stops reading altogether (its process is stopped: nothing of its
sockets is read). Each exec then holds one message in flight; the buffers
beyond each exec's first 16 KiB are held to SANDBOX_EXEC_BUFFER_TOTAL_MB.
Meanwhile another client's exec delivers all its output, and the unread
commands still die at their timeout. Memory is the gateway's VmRSS."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.lib.client import SandboxClient
from tests.lib.gateway import cgroup_pids, holder_pids, running_gateway
from tests.lib.procs import vm_rss_kib, wait_until

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20

CALLS = 150
TOTAL_MIB = 4
# What one unread exec may cost beyond the total: its thread and gRPC call
# (~34 KiB measured), its first buffer in flight (16 KiB) and what gRPC
# holds of it (75-85 KiB measured in all). Before the bound: ~300 KiB each.
PER_CALL_KIB = 128
MARGIN_MIB = 4
# Messages the client reads of each call before it stops: enough for the
# buffers to grow to their largest (16 KiB doubling to 256 KiB).
READ_FIRST = 8
UNREAD_TIMEOUT_S = 15
READER_BYTES = 8_000_000

# The client that stops reading (a process of its own, so that it can be
# stopped whole).
CLIENT = r"""
import json, sys, time
sys.path.insert(0, ".")
import grpc
from tests.lib.grpc_clients import sandbox_modules
pb, pb_grpc = sandbox_modules()
target, token, sid, n, read_first, timeout_s = sys.argv[1:7]
chans = [grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)]) for _ in range(4)]
md = [("authorization", "Bearer " + token)]
calls = [pb_grpc.SandboxStub(chans[i % 4]).Exec(
             pb.ExecRequest(sandbox_id=sid, argv=["head", "-c", "500000000", "/dev/zero"],
                            timeout_seconds=int(timeout_s)), metadata=md, timeout=120)
         for i in range(int(n))]
largest = 0
for c in calls:
    for _ in range(int(read_first)):
        largest = max(largest, len(next(c).stdout))
print(json.dumps({"calls": len(calls), "largest": largest}), flush=True)
time.sleep(600)
"""


def commands(gw, sid: str) -> set[int]:
    """The sandbox's processes but its pid 1."""
    holder = holder_pids(gw, expect=sid).get(sid)
    return cgroup_pids(gw, sid) - {holder}


def settled_rss_kib(pid: int, timeout: float = 20.0) -> int:
    """VmRSS once it stops moving (two reads 1 s apart within 256 KiB)."""
    last = vm_rss_kib(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = vm_rss_kib(pid)
        if abs(now - last) < 256:
            return now
        last = now
    return last


def test_unread_execs_cost_a_bounded_share_each_and_a_named_total(gateway_secret):
    env = {"SANDBOX_EXEC_BUFFER_TOTAL_MB": str(TOTAL_MIB)}
    with running_gateway(env, secret=gateway_secret, check=True) as gw:
        c = SandboxClient(gw)
        client = None
        try:
            sid = c.launch().sandbox_id
            other = c.launch().sandbox_id
            c.ok(sid, "true")
            base = settled_rss_kib(gw.pid)
            client = subprocess.Popen([sys.executable, "-c", CLIENT, gw.target, gw.secret, sid, str(CALLS),
                                       str(READ_FIRST), str(UNREAD_TIMEOUT_S)],
                                      cwd=REPO, stdout=subprocess.PIPE, text=True)
            started = json.loads(client.stdout.readline() or "{}")
            assert started.get("calls") == CALLS, started
            assert started["largest"] == 256 * 1024, f"the buffers of a fast reader grow: {started}"
            assert wait_until(lambda: len(commands(gw, sid)) >= CALLS, 20.0, 0.2), len(commands(gw, sid))
            client.send_signal(signal.SIGSTOP)  # reads nothing more, not even its sockets
            held = settled_rss_kib(gw.pid) - base
            bound = TOTAL_MIB * 1024 + CALLS * PER_CALL_KIB + MARGIN_MIB * 1024
            assert held < bound, (f"{CALLS} unread execs hold {held / 1024:.1f} MiB "
                                  f"({held / CALLS:.0f} KiB each); the bound is {bound / 1024:.1f} MiB")
            # Another tenant's exec still gets all its output, read 16 KiB
            # at a time while the total is taken.
            res = c.exec(other, ["head", "-c", str(READER_BYTES), "/dev/zero"], timeout_seconds=30, rpc_timeout=40)
            assert res.code == 0 and res.stdout == bytes(READER_BYTES), (res.code, len(res.stdout))
            # The unread commands die at their timeout, their client still stopped.
            assert wait_until(lambda: not commands(gw, sid), UNREAD_TIMEOUT_S + 20.0, 0.2), len(commands(gw, sid))
        finally:
            if client is not None:
                client.kill()
                client.wait(10)
            c.cleanup()
