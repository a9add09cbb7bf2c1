"""Forward and ListPorts against the real gateway: a TCP connection made
inside a sandbox's network namespace carries bytes both ways, half-closes,
large and concurrent streams; a refused port fails fast; a server that
stops mid-stream ends the call clearly; and nothing outside the sandbox is
reachable through it."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.lib.client import new_id, pb
from tests.lib.ports import Forward, list_ports, start_server

ECHO = 7000


@pytest.fixture(scope="module")
def box(sbx):
    """A sandbox (egress off) running an echo server on ECHO."""
    sid = new_id("ports")
    sbx.launch(sid)
    start_server(sbx, sid, ECHO, "echo")
    return sid


def _refused(sbx, sid, port):
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        Forward(sbx, sid, port, timeout=30)
    return e.value, time.monotonic() - t0


def test_bytes_flow_both_ways_and_half_close_ends_the_call_ok(sbx, box):
    f = Forward(sbx, box, ECHO)
    f.send(b"hello ")
    assert f.recv() == b"hello "
    f.send(b"world")
    assert f.recv() == b"world"
    f.close_write()
    # The echo server sees EOF, shuts its side: our close_write comes back.
    assert f.read_all() == b""
    f.end()
    assert f.finish() == grpc.StatusCode.OK


def test_first_frame_may_carry_data_and_the_grpc_half_close_is_a_close_write(sbx, box):
    f = Forward(sbx, box, ECHO, first=b"early bytes")
    f.end()
    assert f.read_all() == b"early bytes"
    assert f.finish() == grpc.StatusCode.OK


def test_100_mib_arrive_intact(sbx, box):
    total = 100 * 1024 * 1024
    chunk = os.urandom(1 << 20)
    sent = hashlib.sha256()
    f = Forward(sbx, box, ECHO)

    def writer():
        for i in range(total // len(chunk)):
            piece = chunk[i % 7:] + chunk[:i % 7]
            sent.update(piece)
            f.send(piece)
        f.end()

    t = threading.Thread(target=writer)
    t.start()
    got = hashlib.sha256()
    n = 0
    while True:
        b = f.recv()
        if not b and f.server_closed:
            break
        got.update(b)
        n += len(b)
    t.join()
    assert n == total
    assert got.hexdigest() == sent.hexdigest()
    assert f.finish() == grpc.StatusCode.OK


def test_50_concurrent_connections(sbx, box):
    def one(i):
        f = Forward(sbx, box, ECHO)
        msg = f"connection {i} ".encode() * 100
        f.send(msg)
        f.end()
        out = f.read_all()
        assert f.finish() == grpc.StatusCode.OK
        return out == msg

    with ThreadPoolExecutor(50) as ex:
        assert all(ex.map(one, range(50)))


def test_refused_port_is_failed_precondition_fast(sbx, box):
    err, took = _refused(sbx, box, 9)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "nothing listens on port 9" in err.details()
    assert took < 2.0


def test_unknown_sandbox_and_bad_port(sbx, box):
    err, _ = _refused(sbx, "no-such-sandbox-ports", ECHO)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    for port in (0, 65536):
        err, _ = _refused(sbx, box, port)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_ipv6_loopback_server_is_reached(sbx, box):
    start_server(sbx, box, 7001, "v6")
    # Again and again: after the first, over the IPv4 socket made ahead
    # (refused here, then IPv6).
    for i in range(3):
        f = Forward(sbx, box, 7001, first=b"six %d" % i)
        f.end()
        assert f.read_all() == b"six %d" % i
        assert f.finish() == grpc.StatusCode.OK


def _gateway_sockets(gw):
    n = 0
    for fd in os.listdir(f"/proc/{gw.pid}/fd"):
        try:
            n += os.readlink(f"/proc/{gw.pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def test_connections_one_after_another_and_a_delete_leaves_no_socket_behind(sbx):
    """Each Forward after the first takes the socket made ahead for it; the
    one left over when the sandbox goes is closed with it."""
    sid = new_id("ports-spare")
    before = _gateway_sockets(sbx.gw)
    sbx.launch(sid)
    start_server(sbx, sid, ECHO, "echo")
    for i in range(5):
        f = Forward(sbx, sid, ECHO, first=b"ping %d" % i)
        f.end()
        assert f.read_all() == b"ping %d" % i
        assert f.finish() == grpc.StatusCode.OK
    sbx.delete(sid)
    deadline = time.monotonic() + 10
    while _gateway_sockets(sbx.gw) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gateway_sockets(sbx.gw) <= before


def test_a_server_that_exits_mid_stream_closes_the_stream(sbx):
    sid = new_id("ports-die")
    sbx.launch(sid)
    start_server(sbx, sid, 7002, "die", "partial")
    f = Forward(sbx, sid, 7002)
    assert f.read_all() == b"partial"
    f.end()
    assert f.finish() == grpc.StatusCode.OK
    err, took = _refused(sbx, sid, 7002)  # it is gone now
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and took < 2.0


def test_a_server_that_resets_ends_the_call_unavailable(sbx, box):
    start_server(sbx, box, 7003, "reset", "partial")
    f = Forward(sbx, box, 7003)
    with pytest.raises(grpc.RpcError) as e:
        f.read_all()
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "reset" in e.value.details()


def test_cancelling_the_call_closes_the_connection(sbx, box):
    f = Forward(sbx, box, ECHO)
    f.send(b"x")
    assert f.recv() == b"x"
    f.cancel()
    # The echo server's connection ends (it would otherwise hold a thread).
    f2 = Forward(sbx, box, ECHO, first=b"still serving")
    f2.end()
    assert f2.read_all() == b"still serving"


def test_list_ports_shows_the_servers_with_address_and_pid(sbx, box):
    ports = {(p.port, p.ipv6): p for p in list_ports(sbx, box)}
    echo = ports[(ECHO, False)]
    assert echo.address == "0.0.0.0" and not echo.loopback_only
    assert echo.pid > 0
    ps = sbx.exec(box, ["cat", f"/proc/{echo.pid}/cmdline"]).out
    assert "python3" in ps
    start_server(sbx, box, 7004, "v6")
    v6 = {(p.port, p.ipv6): p for p in list_ports(sbx, box)}[(7004, True)]
    assert v6.address == "::1" and v6.loopback_only


def test_list_ports_of_unknown_sandbox_is_not_found(sbx):
    with pytest.raises(grpc.RpcError) as e:
        list_ports(sbx, "no-such-sandbox-ports")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


# ---- isolation ------------------------------------------------------------------


def test_two_sandboxes_on_the_same_port_answer_each_for_itself(sbx):
    a, b = new_id("ports-a"), new_id("ports-b")
    for sid in (a, b):
        sbx.launch(sid)
        start_server(sbx, sid, 8000, "hello", f"I am {sid}")
    for sid in (a, b):
        f = Forward(sbx, sid, 8000)
        assert f.read_all() == f"I am {sid}".encode()
        f.end()
        assert f.finish() == grpc.StatusCode.OK


def test_no_host_port_is_reachable_through_forward(sbx, gateway):
    sid = new_id("ports-empty")
    sbx.launch(sid)
    assert list_ports(sbx, sid) == []
    # The gateway listens on the host's loopback; the connection is made on
    # the sandbox's own loopback, where nothing listens.
    for port in (22, gateway.port):
        err, took = _refused(sbx, sid, port)
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, (port, err.details())
        assert took < 2.0


def test_a_sandbox_without_egress_still_reaches_nothing_outside(sbx, box, gateway):
    code = ("import socket\n"
            "for host, port in [('127.0.0.1', %d), ('1.1.1.1', 80), ('169.254.169.254', 80)]:\n"
            "    s = socket.socket(); s.settimeout(2)\n"
            "    try:\n"
            "        s.connect((host, port)); print('reached', host)\n"
            "    except OSError as e:\n"
            "        print('refused', host)\n" % gateway.port)
    out = sbx.py(box, code).out
    assert "reached" not in out, out
    # Forward works all the same, with egress off.
    assert not sbx.get(box).allow_egress
    f = Forward(sbx, box, ECHO, first=b"inside")
    f.end()
    assert f.read_all() == b"inside"
