"""grpc.health.v1.Health: Check and Watch, without any token."""

import threading

import grpc
import pytest

from tests.lib.grpc_clients import HealthClient

SANDBOX_SERVICE = "sandbox.v1.Sandbox"


@pytest.mark.parametrize("service", ["", SANDBOX_SERVICE])
def test_check_reports_serving_for_server_and_sandbox_service(health, std_protos, service):
    resp = health.check(service)
    assert resp.status == std_protos.ServingStatus.SERVING


def test_check_needs_no_authorization_even_with_secret_configured(gateway, health, std_protos):
    assert gateway.secret, "this module's gateway runs with a secret"
    assert health.check("").status == std_protos.ServingStatus.SERVING


@pytest.mark.parametrize("service", ["no.such.Service", "sandbox.v1.Sandboxx", "grpc.health.v1"])
def test_check_unknown_service_fails_with_not_found(health, service):
    with pytest.raises(grpc.RpcError) as err:
        health.check(service)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_check_long_unknown_service_name_fails_with_not_found(health):
    # The name is client input: echoing all of it into the status would make
    # the trailers exceed the client's metadata limit.
    with pytest.raises(grpc.RpcError) as err:
        health.check("x" * 20000)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()


def _first_and_then(call):
    """The first response of a Watch call, and how the stream continued:
    ("deadline", None) when it stayed open until the call's deadline."""
    first = next(call)
    try:
        second = next(call)
        return first, ("message", second)
    except StopIteration:
        return first, ("ended", call.code())
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return first, ("deadline", None)
        return first, ("error", e.code())


@pytest.mark.parametrize("service", ["", SANDBOX_SERVICE])
def test_watch_sends_serving_immediately_and_keeps_stream_open(health, std_protos, service):
    # The deadline bounds the wait: an open stream ends only by that deadline.
    call = health.watch(service, timeout=2.0)
    first, after = _first_and_then(call)
    assert first.status == std_protos.ServingStatus.SERVING
    assert after == ("deadline", None), f"Watch stream did not stay open: {after}"


def test_watch_unknown_service_streams_service_unknown_and_keeps_stream_open(health, std_protos):
    call = health.watch("no.such.Service", timeout=2.0)
    first, after = _first_and_then(call)
    assert first.status == std_protos.ServingStatus.SERVICE_UNKNOWN
    assert after == ("deadline", None), f"Watch stream did not stay open: {after}"


def test_watch_cancelled_by_client_leaves_gateway_serving(gateway, health, std_protos):
    calls = [health.watch("", timeout=30.0) for _ in range(5)]
    for call in calls:
        assert next(call).status == std_protos.ServingStatus.SERVING
    for call in calls:
        call.cancel()
    assert health.check("").status == std_protos.ServingStatus.SERVING
    assert gateway.alive()


def test_many_sequential_checks_on_one_channel_and_on_new_channels(gateway, health, std_protos):
    for _ in range(200):
        assert health.check("").status == std_protos.ServingStatus.SERVING
    for _ in range(20):
        ch = grpc.insecure_channel(gateway.target)
        try:
            assert HealthClient(ch, std_protos).check(SANDBOX_SERVICE).status == \
                std_protos.ServingStatus.SERVING
        finally:
            ch.close()


def test_concurrent_checks_from_many_threads_all_succeed(health, std_protos):
    errors = []
    statuses = []
    lock = threading.Lock()

    def worker():
        for _ in range(25):
            try:
                status = health.check("").status
            except grpc.RpcError as e:  # collected, asserted below
                status = None
                with lock:
                    errors.append(e.code())
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "health checks hung"
    assert errors == []
    assert statuses == [std_protos.ServingStatus.SERVING] * 200


def test_health_follows_the_runtime_self_check(std_protos, gateway_secret, tmp_path):
    """The gateway checks every few seconds that it can still do its job:
    its image gone, health turns NOT_SERVING (and says why in its log);
    back, SERVING again."""
    from tests.lib.gateway import running_gateway
    from tests.lib.procs import wait_until
    image = tmp_path / "image"
    image.mkdir()
    with running_gateway({"SANDBOX_ROOTFS": str(image)}, secret=gateway_secret) as gw:
        h = HealthClient(gw.channel(), std_protos)
        serving, not_serving = std_protos.ServingStatus.SERVING, std_protos.ServingStatus.NOT_SERVING
        assert h.check("").status == serving
        image.rename(tmp_path / "elsewhere")
        assert wait_until(lambda: h.check("").status == not_serving, 10.0)
        assert h.check(SANDBOX_SERVICE).status == not_serving
        assert wait_until(lambda: "SANDBOX_ROOTFS" in gw.logs.text(), 5.0), gw.logs.text()[-2000:]
        (tmp_path / "elsewhere").rename(image)
        assert wait_until(lambda: h.check("").status == serving, 10.0)
