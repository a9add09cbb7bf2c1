"""Graceful shutdown on SIGTERM with clients connected."""

import signal
import threading

import grpc

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
