"""Hostile kernels: a kernelspec whose program speaks ZMQ badly (wrong
signatures, frames over the gateway's cap, an endless iopub flood, no
answer at all). Each call ends cleanly with a clear error or a restart
(a frame over the cap at once, not at a timeout), the gateway's memory
stays bounded, and another sandbox's code runs meanwhile."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.lib import code
from tests.lib.client import sandbox_client
from tests.lib.gateway import cgroup_pids, running_gateway
from tests.lib.procs import RssSampler, wait_until

# Starts like a kernel (kernel_info answered, signed), then misbehaves on
# execute_request as its first argument says.
FAKE_KERNEL = r'''
import hashlib, hmac, json, signal, sys, time, uuid
import zmq

mode, conn = sys.argv[1], json.load(open(sys.argv[2]))
signal.signal(signal.SIGINT, signal.SIG_IGN)
key = conn["key"].encode()
ctx = zmq.Context()
def bind(kind, port):
    s = ctx.socket(kind)
    s.bind(f"tcp://127.0.0.1:{port}")
    return s
shell, iopub, control = bind(zmq.ROUTER, conn["shell_port"]), bind(zmq.PUB, conn["iopub_port"]), \
    bind(zmq.ROUTER, conn["control_port"])

def frames(msg_type, parent, content, good=True):
    parts = [json.dumps(p).encode() for p in (
        {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": "s", "username": "u", "date": "",
         "version": "5.3"}, parent, {}, content)]
    sig = hmac.new(key if good else b"wrong", b"".join(parts), hashlib.sha256).hexdigest().encode()
    return [b"<IDS|MSG>", sig] + parts

def handle(idents, parts):
    header = json.loads(parts[parts.index(b"<IDS|MSG>") + 2])
    if header["msg_type"] == "kernel_info_request":
        big = {"banner": "b" * (20 << 20)} if mode == "oversized-info" else {}
        shell.send_multipart(idents + frames("kernel_info_reply", header, {"status": "ok", **big}))
        iopub.send_multipart(frames("status", header, {"execution_state": "idle"}))
    elif header["msg_type"] == "execute_request":
        if mode == "badsig":
            iopub.send_multipart(frames("stream", header, {"name": "stdout", "text": "x"}, good=False))
            shell.send_multipart(idents + frames("execute_reply", header, {"status": "ok"}, good=False))
        elif mode == "oversized":
            iopub.send_multipart(frames("stream", header, {"name": "stdout", "text": "y" * (20 << 20)}))
        elif mode in ("flood", "bigflood"):
            # bigflood: each message just under the gateway's 8 MiB frame cap.
            chunk = {"name": "stdout", "text": "z" * (65536 if mode == "flood" else (8 << 20) - 4096)}
            while True:
                iopub.send_multipart(frames("stream", header, chunk))
        elif mode == "garbage":
            iopub.send_multipart([b"not", b"a", b"jupyter", b"message"])
            shell.send_multipart(idents + [b"<IDS|MSG>", b"00", b"{", b"}", b"[", b"]"])
        # "silent": nothing at all.

while True:
    for s in zmq.select([shell, control], [], [], 1.0)[0]:
        parts = s.recv_multipart()
        d = parts.index(b"<IDS|MSG>")
        handle(parts[:d], parts)
'''

MODES = ["badsig", "oversized", "oversized-info", "flood", "bigflood", "garbage", "silent"]
SPEC_DIR = "/root/.local/share/jupyter/kernels"


@pytest.fixture(scope="module")
def gwh(gateway_secret):
    with running_gateway(secret=gateway_secret, check=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gwh):
    with sandbox_client(gwh) as c:
        yield c


@pytest.fixture(scope="module")
def sid(client):
    sid = client.launch().sandbox_id
    client.write_file(sid, "/root/fake_kernel.py", FAKE_KERNEL.encode())
    for mode in MODES:
        client.write_file(sid, f"{SPEC_DIR}/fake-{mode}/kernel.json", json.dumps({
            "argv": ["/usr/bin/python3", "/root/fake_kernel.py", mode, "{connection_file}"],
            "display_name": mode, "language": "fake"}).encode(), make_parents=True)
    return sid


def test_a_kernel_with_wrong_signatures_fails_the_call_only(client, sid):
    with pytest.raises(grpc.RpcError) as e:
        code.run(client, sid, "1", language="fake-badsig")
    assert e.value.code() == grpc.StatusCode.INTERNAL and "signature" in e.value.details()


def test_a_kernel_sending_garbage_fails_the_call_only(client, sid):
    with pytest.raises(grpc.RpcError) as e:
        code.run(client, sid, "1", language="fake-garbage")
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "not a Jupyter message" in e.value.details() or "signature" in e.value.details()


def test_a_kernel_that_never_answers_times_out_and_is_restarted(client, sid):
    cell = code.run(client, sid, "1", language="fake-silent", timeout_seconds=2, timeout=60)
    assert cell.end.restarted and "did not stop" in cell.end.message
    assert cell.stdout == ""


def oversized_refused(e: grpc.RpcError, link: str) -> bool:
    return (e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and f"`{link}` connection was dropped" in e.details()
            and "8 MiB cap (JMSG_FRAME_MAX)" in e.details())


def test_a_frame_over_the_cap_fails_the_cell_at_once_and_the_next_cell_restarts_the_kernel(client, sid):
    """libzmq drops the connection of a peer that sends a frame over
    ZMQ_MAXMSGSIZE without a word; the gateway notices the drop and fails the
    call then, not at the cell's timeout (60 s here)."""
    cid = code.create(client, sid, language="fake-oversized").context_id
    try:
        for _ in range(2):  # the second cell starts a new kernel first
            t0 = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                code.run(client, sid, "1", context_id=cid, timeout_seconds=60, timeout=90)
            took = time.monotonic() - t0
            assert oversized_refused(e.value, "iopub"), e.value.details()
            assert took < 10, took
        assert cid in [c.context_id for c in code.contexts(client, sid).contexts]
    finally:
        code.delete(client, sid, cid)


def test_a_frame_over_the_cap_at_start_fails_the_start_at_once(client, sid):
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        code.create(client, sid, language="fake-oversized-info", timeout=90)
    took = time.monotonic() - t0
    assert oversized_refused(e.value, "shell"), e.value.details()
    assert took < 10, took  # not the start's 60 s (CODE_START_MS)
    assert [c for c in code.contexts(client, sid).contexts if c.language == "fake-oversized-info"] == []


def test_an_endless_iopub_flood_costs_bounded_memory_and_other_sandboxes_run(gwh, client, sid):
    other = client.launch().sandbox_id
    code.run(client, other, "warm = 1")
    before = gwh.vm_rss_kib()
    peak = [before]
    received = [0]
    done = threading.Event()

    def sample():
        while not done.wait(0.2):
            peak[0] = max(peak[0], gwh.vm_rss_kib())

    t = threading.Thread(target=sample)
    t.start()
    try:
        call = code.run_call(client, sid, "1", language="fake-flood", timeout_seconds=4, timeout=60)
        beside = None
        for ev in call:
            if ev.WhichOneof("event") == "stdout":
                received[0] += len(ev.stdout)
                if beside is None and received[0] > (8 << 20):
                    beside = code.run(client, other, "warm + 1")
            elif ev.WhichOneof("event") == "end":
                assert ev.end.restarted
    finally:
        done.set()
        t.join()
    assert received[0] > (8 << 20)
    assert beside is not None and beside.main.text == "2"
    assert (peak[0] - before) < 256 * 1024, (before, peak[0])



def kernel_pids(gw, sid: str, mode: str) -> set[int]:
    """Host pids of the fake kernels of `mode` in sandbox `sid`."""
    found = set()
    for pid in cgroup_pids(gw, sid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"/root/fake_kernel.py" in argv and mode.encode() in argv:
            found.add(pid)
    return found


@pytest.mark.parametrize("mode", ["flood", "bigflood"])
def test_a_client_that_stops_reading_a_flood_still_has_its_cell_timed_out_in_bounded_memory(gwh, client, sid, mode):
    """The kernel floods iopub (64 KiB messages, or ones just under the
    8 MiB frame cap) and the client stops reading: the gateway reads no
    more from the kernel meanwhile (one event under way, the kernel's
    queues bounded), yet the cell's timeout still interrupts, then restarts
    the kernel while the client reads nothing, and the gateway's peak RSS
    (sampled every 50 ms) stays within a generous bound."""
    others = kernel_pids(gwh, sid, mode)  # of other tests' contexts
    cid = code.create(client, sid, language=f"fake-{mode}").context_id
    try:
        with RssSampler(gwh, interval=0.05) as rss:
            call = code.run_call(client, sid, "1", context_id=cid, timeout_seconds=3, timeout=90)
            got = 0
            events = iter(call)
            while got < (16 << 20):
                ev = next(events)
                got += len(ev.stdout)
            first = kernel_pids(gwh, sid, mode) - others
            assert len(first) == 1, first
            # Not reading: 3 s to the timeout, CODE_INTERRUPT_GRACE_MS (3 s)
            # to the restart (the fake kernel ignores SIGINT).
            assert wait_until(lambda: kernel_pids(gwh, sid, mode) - others - first, 20, interval=0.2), "not restarted"
            stalled_peak = rss.peak_kib
            end = [ev for ev in events if ev.WhichOneof("event") == "end"]
            assert end and end[0].end.restarted and "timed out" in end[0].end.message, end
        growth = (stalled_peak - rss.start_kib) / 1024
        assert growth < 192 and rss.growth_mib < 192, (rss.start_kib, stalled_peak, rss.peak_kib, rss.samples)
    finally:
        code.delete(client, sid, cid)
