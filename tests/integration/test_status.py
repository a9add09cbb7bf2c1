"""Status names the gateway that answers: SANDBOX_GATEWAY_NAME, else the
host name (in a StatefulSet, the pod's stable name); the "listening" log
line at start says the same."""

from __future__ import annotations

import socket

from tests.lib.client import SandboxClient, pb


def status(gw):
    return SandboxClient(gw).stub.Status(pb.StatusRequest(), metadata=gw.auth_metadata(), timeout=10)


def test_status_reports_the_host_name_by_default(gateways):
    gw = gateways.gateway(secret="s")
    assert status(gw).gateway_name == socket.gethostname()
    assert gw.listening_record["gateway_name"] == socket.gethostname()


def test_status_reports_sandbox_gateway_name(gateways):
    gw = gateways.gateway({"SANDBOX_GATEWAY_NAME": "sandbox-gateway-2.sandbox.default.svc"}, secret="s")
    assert status(gw).gateway_name == "sandbox-gateway-2.sandbox.default.svc"
    assert gw.listening_record["gateway_name"] == "sandbox-gateway-2.sandbox.default.svc"
