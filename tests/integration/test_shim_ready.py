"""GET /ready: the shim's readiness, beside the contract's /health.

200 only when the gateway is reachable, SERVING and accepts the shim's
secret; otherwise 503 {"detail": reason}. /health keeps answering 200 with
its contract body in every one of these set-ups."""

import socket
import threading
import time

import pytest

from tests.lib.procs import free_port


def _assert_health_unchanged(shim, cli_mounted):
    r = shim.request("GET", "/health", auth=False, timeout=30)
    assert r.status == 200, r
    assert r.json() == {"cli_mounted": cli_mounted, "allow_egress": False}, r


def _ready(shim, **kw):
    r = shim.request("GET", "/ready", timeout=30, **kw)
    assert r.headers.get("content-type", "").startswith("application/json"), r
    return r


def test_ready_is_200_without_a_token_when_all_is_well(shims):
    gw = shims.gateway(secret="ready-secret")
    s = shims.shim(gw)
    for auth in (False, True):
        r = _ready(s, auth=auth)
        assert r.status == 200, r
    _assert_health_unchanged(s, True)


def test_ready_is_503_when_the_gateway_rejects_the_shims_secret(shims):
    gw = shims.gateway(secret="right-secret")
    s = shims.shim(gw, env={"SHIM_GATEWAY_SECRET": "wrong-secret"})
    r = _ready(s, auth=False)
    assert r.status == 503, r
    assert set(r.json()) == {"detail"}, r
    assert "UNAUTHENTICATED" in r.json()["detail"], r
    assert "right-secret" not in r.json()["detail"] and "wrong-secret" not in r.json()["detail"]
    # The contract's health stays as it was: the gateway answers and serves.
    r = s.request("GET", "/health", auth=False)
    assert r.status == 200 and r.json()["cli_mounted"] is True, r


def test_ready_is_503_when_the_gateway_has_no_secret(shims):
    gw = shims.gateway(secret=None)
    s = shims.shim(gw, secret="shim-secret")
    r = _ready(s, auth=False)
    assert r.status == 503, r
    assert "gateway secret not configured" in r.json()["detail"], r
    assert "UNAVAILABLE" in r.json()["detail"], r
    _assert_health_unchanged(s, True)


def test_ready_is_503_when_the_gateway_is_down(shims):
    s = shims.shim(target=f"127.0.0.1:{free_port()}", secret="x")
    r = _ready(s, auth=False)
    assert r.status == 503, r
    assert "unreachable" in r.json()["detail"].lower(), r
    _assert_health_unchanged(s, False)


def test_ready_follows_the_gateway_going_away_within_the_cache_time(shims):
    gw = shims.gateway(secret="s")
    s = shims.shim(gw)
    assert _ready(s, auth=False).status == 200
    assert gw.stop() == 0
    deadline = time.monotonic() + 10
    while True:
        r = _ready(s, auth=False)
        if r.status == 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status == 503, r


def test_a_burst_of_probes_is_answered_from_the_cached_verdict(shims):
    gw = shims.gateway(secret="s")
    s = shims.shim(gw)
    assert _ready(s, auth=False).status == 200
    t0 = time.monotonic()
    for _ in range(50):
        assert _ready(s, auth=False).status == 200
    assert time.monotonic() - t0 < 5


def test_ready_has_no_side_effects_on_auth(shims):
    gw = shims.gateway(secret="s")
    s = shims.shim(gw)
    assert _ready(s, token="wrong").status == 200


@pytest.mark.parametrize("path", ["/ready", "/health"])
def test_probes_during_a_slow_check_take_the_last_answer_at_once(shims, path):
    """A gateway that accepts connections and never answers: each check
    takes its whole deadline. While one request checks, the others (no
    token needed) get the last answer at once instead of each holding one
    of the shim's two workers until the check ends."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        s = shims.shim(target=f"127.0.0.1:{silent.getsockname()[1]}", secret="x",
                       env={"SHIM_MAX_WORKERS": "2"})
        first = s.request("GET", path, auth=False, timeout=30)
        time.sleep(1.2)  # the answer is older than its reuse time
        checking = threading.Thread(target=lambda: s.request("GET", path, auth=False, timeout=30))
        t0 = time.monotonic()
        checking.start()
        time.sleep(0.3)
        times = []
        for _ in range(6):
            t = time.monotonic()
            r = s.request("GET", path, auth=False, timeout=30)
            times.append(time.monotonic() - t)
            assert (r.status, r.body) == (first.status, first.body), (r, first)
        during = time.monotonic() - t0
        checking.join(30)
        # They came back while the check still ran (it takes >= 2 s).
        assert during < 1.8, (during, times)
