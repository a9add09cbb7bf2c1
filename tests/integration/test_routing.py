"""Calls to methods the gateway does not serve."""

import grpc
import pytest

from tests.lib.grpc_clients import rpc_code


def _raw_unary(channel, path):
    return channel.unary_unary(path, request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)


@pytest.mark.parametrize("path", [
    "/foo.Bar/Baz",
    "/grpc.health.v1.Health/NoSuchMethod",
    "/grpc.reflection.v1.ServerReflection/NoSuchMethod",
])
def test_unknown_method_is_unimplemented(gateway, path):
    code, details = rpc_code(_raw_unary(gateway.channel(), path), b"", timeout=10.0)
    assert code == grpc.StatusCode.UNIMPLEMENTED, details


def test_unknown_sandbox_method_with_valid_token_is_unimplemented(gateway):
    code, details = rpc_code(_raw_unary(gateway.channel(), "/sandbox.v1.Sandbox/NoSuchMethod"),
                             b"", metadata=gateway.auth_metadata(), timeout=10.0)
    assert code == grpc.StatusCode.UNIMPLEMENTED, details


def test_unknown_method_streaming_call_is_unimplemented(gateway):
    call = gateway.channel().stream_stream("/foo.Bar/Stream", request_serializer=lambda b: b,
                                           response_deserializer=lambda b: b)
    code, details = rpc_code(call, iter([b"a", b"b"]), timeout=10.0)
    assert code == grpc.StatusCode.UNIMPLEMENTED, details


def test_gateway_keeps_serving_after_unknown_methods(gateway, health, std_protos):
    for i in range(50):
        rpc_code(_raw_unary(gateway.channel(), f"/foo.Bar/Baz{i}"), b"x" * i, timeout=10.0)
    assert health.check("").status == std_protos.ServingStatus.SERVING


def test_garbage_request_bytes_do_not_crash_the_gateway(gateway, health, std_protos):
    # Bytes that are not a valid HealthCheckRequest / ServerReflectionRequest.
    garbage = b"\xff\xff\xff\xff\x0f\x0a\xff"
    for path in ["/grpc.health.v1.Health/Check", "/sandbox.v1.Sandbox/Get"]:
        code, _ = rpc_code(_raw_unary(gateway.channel(), path), garbage,
                           metadata=gateway.auth_metadata(), timeout=10.0)
        assert code != grpc.StatusCode.OK
    assert health.check("").status == std_protos.ServingStatus.SERVING
