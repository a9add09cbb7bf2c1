"""Graceful shutdown on SIGTERM with clients connected."""

import base64
import signal
import threading
import time

import grpc
import pytest

from tests.lib.grpc_clients import HealthClient
from tests.lib.procs import EXIT_MARGIN_S, assert_all_json_lines

GRACE_S = 3


def _drain_watch(call, out):
    """Collects a Watch stream's remaining responses and how it ended."""
    try:
        for resp in call:
            out["statuses"].append(resp.status)
        out["end"] = ("ended", call.code())
    except grpc.RpcError as e:
        out["end"] = ("error", e.code())


def test_sigterm_ends_open_watch_streams_and_exits_zero_within_grace(gateways, std_protos):
    gw = gateways.gateway({"SANDBOX_SHUTDOWN_GRACE_SECONDS": str(GRACE_S)}, secret="s")
    health = HealthClient(gw.channel(), std_protos)
    # The call deadline is far past grace + margin: if the stream is still
    # open when the gateway should be gone, the deadline reports it.
    deadline = GRACE_S + EXIT_MARGIN_S + 10
    calls = [health.watch(service, timeout=deadline) for service in ("", "sandbox.v1.Sandbox")]
    for call in calls:
        assert next(call).status == std_protos.ServingStatus.SERVING

    results = [{"statuses": [], "end": None} for _ in calls]
    readers = [threading.Thread(target=_drain_watch, args=(c, r)) for c, r in zip(calls, results)]
    for t in readers:
        t.start()

    gw.send_signal(signal.SIGTERM)
    assert gw.wait(timeout=GRACE_S + EXIT_MARGIN_S) == 0

    for t in readers:
        t.join(deadline + 5)
    for r in results:
        assert r["end"] is not None, "a Watch stream was still open after the gateway exited"
        assert r["end"] != ("error", grpc.StatusCode.DEADLINE_EXCEEDED), r
        if r["statuses"]:
            assert r["statuses"][-1] == std_protos.ServingStatus.NOT_SERVING, r


def test_sigterm_with_idle_connections_exits_zero_within_grace(gateways, std_protos):
    gw = gateways.gateway({"SANDBOX_SHUTDOWN_GRACE_SECONDS": str(GRACE_S)}, secret="s")
    channels = [gw.channel() for _ in range(5)]
    for ch in channels:
        assert HealthClient(ch, std_protos).check("").status == std_protos.ServingStatus.SERVING
    gw.send_signal(signal.SIGTERM)
    assert gw.wait(timeout=GRACE_S + EXIT_MARGIN_S) == 0


def test_log_lines_stay_json_through_shutdown(gateways):
    gw = gateways.gateway({"SANDBOX_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
                           "SANDBOX_LOG_LEVEL": "debug"}, secret="s")
    gw.send_signal(signal.SIGTERM)
    assert gw.wait(timeout=GRACE_S + EXIT_MARGIN_S) == 0
    assert_all_json_lines(gw.logs.snapshot())


# --- the drain: NOT_SERVING first, new calls refused, calls in flight finish ---

DRAIN_GRACE_S = 30


def _launch(shim, sid):
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid})
    assert r.status == 201, r


def _wait_not_serving(health, std_protos, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if health.check("").status == std_protos.ServingStatus.NOT_SERVING:
            return
        time.sleep(0.05)
    pytest.fail("health did not turn NOT_SERVING after SIGTERM")


def test_sigterm_drains_new_calls_503_while_a_long_exec_finishes(gateways, std_protos, sandbox_api):
    gw = gateways.gateway({"SANDBOX_SHUTDOWN_GRACE_SECONDS": str(DRAIN_GRACE_S)}, secret="s")
    shim = gateways.shim(gw)
    health = HealthClient(gw.channel(), std_protos)
    _launch(shim, "drain-a")
    marker = "/tmp/long-exec-started"
    result = {}

    def long_exec():
        result["r"] = shim.request("POST", "/sandboxes/drain-a/exec",
                                   {"argv": ["sh", "-c", f"touch {marker}; sleep 3; echo finished"]}, timeout=60)

    t = threading.Thread(target=long_exec)
    t.start()
    try:
        # The command is running once its marker exists inside the sandbox.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = shim.request("POST", "/sandboxes/drain-a/exec", {"argv": ["test", "-e", marker]})
            if r.status == 200 and r.json()["exit_code"] == 0:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the long exec did not start")

        t0 = time.monotonic()
        gw.send_signal(signal.SIGTERM)
        _wait_not_serving(health, std_protos)

        # A new exec through the shim: the gateway's own UNAVAILABLE, so 503, never 502.
        r = shim.request("POST", "/sandboxes/drain-a/exec", {"argv": ["true"]})
        assert r.status == 503, r
        assert "shutting down" in r.json()["detail"], r
        r = shim.request("POST", "/sandboxes", {"sandbox_id": "drain-b"})
        assert r.status == 503, r
        # Readiness says why.
        r = shim.request("GET", "/ready", auth=False)
        assert r.status == 503 and "NOT_SERVING" in r.json()["detail"], r
        # Directly over gRPC: UNAVAILABLE "shutting down".
        pb2, pb2_grpc = sandbox_api
        with pytest.raises(grpc.RpcError) as err:
            pb2_grpc.SandboxStub(gw.channel()).List(pb2.ListRequest(), metadata=gw.auth_metadata(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in err.value.details()
    finally:
        t.join(60)

    # The exec started before SIGTERM finished with its output.
    r = result["r"]
    assert r.status == 200, r
    assert r.json()["exit_code"] == 0, r
    assert base64.b64decode(r.json()["stdout_b64"]) == b"finished\n", r
    # Then the gateway exits, well before the grace ends.
    assert gw.wait(timeout=DRAIN_GRACE_S) == 0
    assert time.monotonic() - t0 < DRAIN_GRACE_S / 2


def test_health_watch_reports_not_serving_after_sigterm_while_calls_drain(gateways, std_protos, sandbox_api):
    gw = gateways.gateway({"SANDBOX_SHUTDOWN_GRACE_SECONDS": str(DRAIN_GRACE_S)}, secret="s")
    pb2, pb2_grpc = sandbox_api
    stub = pb2_grpc.SandboxStub(gw.channel())
    stub.Launch(pb2.LaunchRequest(sandbox_id="drain-w"), metadata=gw.auth_metadata(), timeout=60)
    health = HealthClient(gw.channel(), std_protos)
    watch = health.watch("sandbox.v1.Sandbox", timeout=60)
    assert next(watch).status == std_protos.ServingStatus.SERVING
    # An exec in flight keeps the gateway draining.
    running = stub.Exec(pb2.ExecRequest(sandbox_id="drain-w", argv=["sleep", "2"]),
                        metadata=gw.auth_metadata(), timeout=60)
    time.sleep(0.5)
    gw.send_signal(signal.SIGTERM)
    assert next(watch).status == std_protos.ServingStatus.NOT_SERVING
    assert health.check("sandbox.v1.Sandbox").status == std_protos.ServingStatus.NOT_SERVING
    events = list(running)
    assert events and events[-1].WhichOneof("event") == "exit", events
    assert gw.wait(timeout=DRAIN_GRACE_S) == 0
