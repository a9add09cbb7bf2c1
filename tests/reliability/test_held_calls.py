"""Calls are not threads before they are admitted: anyone who can reach the
gateway's port can open calls and never send their request. Unauthenticated
calls to the Sandbox service are refused before they get a thread; calls to
the open methods (health, reflection) are capped (SANDBOX_MAX_OPEN_CALLS);
every call whose request does not come within SANDBOX_FIRST_MESSAGE_SECONDS
is cancelled. The gateway's thread count stays bounded and authenticated
work goes on."""

from __future__ import annotations

import os
import threading

import grpc
import pytest

from tests.lib.client import sandbox_client
from tests.lib.gateway import running_gateway
from tests.lib.procs import wait_until

MAX_OPEN = 64


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture
def held_gateway(secret):
    env = {"SANDBOX_MAX_OPEN_CALLS": str(MAX_OPEN), "SANDBOX_FIRST_MESSAGE_SECONDS": "4"}
    with running_gateway(env, secret=secret, check=True) as gw:
        yield gw


def hold(channel, method: str, n: int, stop: threading.Event, metadata=None):
    """Opens `n` calls of `method` that send their metadata and never a
    message (until `stop`)."""
    def never():
        stop.wait()
        return
        yield  # a generator that yields nothing

    call = channel.stream_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    return [call.future(never(), metadata=metadata, timeout=120) for _ in range(n)]


def finish(futures, stop):
    stop.set()
    for f in futures:
        f.cancel()


def test_1500_silent_calls_leave_the_threads_bounded_and_launch_answering(held_gateway, secret):
    gw = held_gateway
    before = threads_of(gw.pid)
    stop = threading.Event()
    ch = grpc.insecure_channel(gw.target)
    futures = []
    try:
        futures += hold(ch, "/grpc.health.v1.Health/Check", 750, stop)
        futures += hold(ch, "/sandbox.v1.Sandbox/Launch", 750, stop)  # no token
        peak = before
        for _ in range(20):
            peak = max(peak, threads_of(gw.pid))
            stop.wait(0.1)
        assert peak <= before + MAX_OPEN + 16, (before, peak)
        with sandbox_client(gw) as sbx:
            sid = sbx.launch().sandbox_id
            assert sbx.sh_out(sid, "echo alive") == "alive\n"
    finally:
        finish(futures, stop)
        ch.close()
    assert wait_until(lambda: threads_of(gw.pid) <= before + 8, 20.0, 0.2), (before, threads_of(gw.pid))


def test_unauthenticated_calls_are_refused_at_once(held_gateway):
    stop = threading.Event()
    ch = grpc.insecure_channel(held_gateway.target)
    futures = hold(ch, "/sandbox.v1.Sandbox/Launch", 20, stop)
    try:
        for f in futures:
            with pytest.raises(grpc.RpcError) as e:
                f.result(timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        finish(futures, stop)
        ch.close()


def test_a_call_whose_request_never_comes_is_cancelled(held_gateway):
    stop = threading.Event()
    ch = grpc.insecure_channel(held_gateway.target)
    futures = hold(ch, "/grpc.health.v1.Health/Check", 5, stop)
    try:
        for f in futures:
            with pytest.raises(grpc.RpcError) as e:
                f.result(timeout=30)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
            assert "no request message" in e.value.details()
    finally:
        finish(futures, stop)
        ch.close()


def test_open_calls_past_the_cap_are_refused_and_come_back(held_gateway):
    stop = threading.Event()
    ch = grpc.insecure_channel(held_gateway.target)
    futures = hold(ch, "/grpc.health.v1.Health/Check", MAX_OPEN, stop)
    try:
        check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)

        def refused():
            try:
                check(b"", timeout=5)
                return False
            except grpc.RpcError as e:
                return e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert wait_until(refused, 10.0, 0.2)
        finish(futures, stop)
        assert wait_until(lambda: not refused(), 15.0, 0.2)
    finally:
        finish(futures, stop)
        ch.close()
