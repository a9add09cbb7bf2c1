"""sandbox-shim as an agent backend uses it: the full agent-turn cycle,
NDJSON streaming that delivers output while the command runs, and a client
that hangs up mid-exec (the command must be killed)."""

from __future__ import annotations

import io
import json
import socket
import tarfile
import time

import pytest

from tests.lib.client import new_id
from tests.lib.procs import wait_until
from tests.lib.shim import ShimClient, unb64


def test_agent_turn_cycle(client, shim):
    """launch → exec → GET tar → DELETE → restore from that tar under the
    same id → exec finds the file → DELETE."""
    sid = new_id("turn")
    client.launch(sid)
    body = client.run(sid, ["/bin/bash", "-lc", "echo hi > /tmp/f; cat /tmp/f"])
    assert body["exit_code"] == 0 and body["timed_out"] is False, body
    assert body["stdout"] == "hi\n", body

    r = shim.request("GET", f"/sandboxes/{sid}/tar")
    assert r.status == 200 and r.headers["content-type"] == "application/x-tar", r
    archive = r.body
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as t:
        assert t.extractfile(t.getmember("tmp/f")).read() == b"hi\n"

    r = shim.request("DELETE", f"/sandboxes/{sid}")
    assert r.status == 204, r
    assert client.exec(sid, ["true"]).status == 404

    r = shim.request("POST", f"/sandboxes/{sid}/restore?allow_egress=false", archive,
                     headers={"Content-Type": "application/x-tar"})
    assert r.status == 201 and r.json() == {"sandbox_id": sid}, r
    body = client.run(sid, ["cat", "/tmp/f"])
    assert body["exit_code"] == 0 and body["stdout"] == "hi\n", body

    r = shim.request("DELETE", f"/sandboxes/{sid}")
    assert r.status == 204, r
    client.created.discard(sid)


# ---- NDJSON ---------------------------------------------------------------------------

def _ndjson_lines(resp):
    while True:
        line = resp.readline()
        if not line:
            return
        yield json.loads(line)


def test_ndjson_streams_before_the_command_ends(client, shim):
    sid = client.launch()
    script = "echo first; while [ ! -f /tmp/go ]; do sleep 0.1; done; echo second; echo err >&2; exit 4"
    conn = shim.connection(timeout=20)
    try:
        conn.request("POST", f"/sandboxes/{sid}/exec",
                     body=json.dumps({"argv": ["sh", "-c", script], "timeout": 60}),
                     headers={**shim.auth_headers(), "Content-Type": "application/json",
                              "Accept": "application/x-ndjson"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type") == "application/x-ndjson"
        # The first line must arrive while the command still waits for
        # /tmp/go (nobody has created it yet): buffered output would block
        # here until the socket timeout.
        first = json.loads(resp.readline())
        assert set(first) == {"stdout_b64"}, first
        assert unb64(first["stdout_b64"]) == b"first\n"

        assert client.sh(sid, "touch /tmp/go") == ""

        events = list(_ndjson_lines(resp))
    finally:
        conn.close()
    assert events, "no event after the first line"
    exit_ev = events[-1]
    assert exit_ev == {"exit_code": 4, "timed_out": False}, events
    out = b"".join(unb64(e["stdout_b64"]) for e in events[:-1] if "stdout_b64" in e)
    err = b"".join(unb64(e["stderr_b64"]) for e in events[:-1] if "stderr_b64" in e)
    assert out == b"second\n" and err == b"err\n", events
    for e in events[:-1]:
        assert set(e) in ({"stdout_b64"}, {"stderr_b64"}), e


def test_ndjson_timeout_and_signal(client, shim):
    sid = client.launch()
    for argv, timeout, want in [
        (["sleep", "30"], 1, {"exit_code": None, "timed_out": True}),
        (["sh", "-c", "kill -9 $$"], 30, {"exit_code": -9, "timed_out": False}),
    ]:
        conn = shim.connection(timeout=30)
        try:
            conn.request("POST", f"/sandboxes/{sid}/exec", body=json.dumps({"argv": argv, "timeout": timeout}),
                         headers={**shim.auth_headers(), "Content-Type": "application/json",
                                  "Accept": "application/x-ndjson"})
            resp = conn.getresponse()
            assert resp.status == 200
            events = list(_ndjson_lines(resp))
        finally:
            conn.close()
        assert events and events[-1] == want, events


# ---- client hang-up ---------------------------------------------------------------------

PROCS = ("for p in /proc/[0-9]*; do tr '\\000' ' ' < $p/cmdline 2>/dev/null; echo; done")


def _sleepers(client, sid) -> int:
    out = client.sh(sid, PROCS)
    return sum(1 for line in out.splitlines() if line.strip() == "sleep 1000")


@pytest.mark.parametrize("accept", ["application/json", "application/x-ndjson"])
def test_client_disconnect_kills_the_command(client, shim, accept):
    sid = client.launch()
    body = json.dumps({"argv": ["sh", "-c", "sleep 1000"], "timeout": 3600}).encode()
    head = (f"POST /sandboxes/{sid}/exec HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {shim.secret}\r\nContent-Type: application/json\r\n"
            f"Accept: {accept}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection((shim.host, shim.port), timeout=10)
    try:
        sock.sendall(head + body)
        # The command really runs before the client leaves.
        assert wait_until(lambda: _sleepers(client, sid) == 1, timeout=10), \
            "sleep 1000 never started"
        sock.settimeout(0.3)
        try:
            sock.recv(1)  # nothing (JSON) or the headers (NDJSON) — either way, then leave
        except socket.timeout:
            pass
    finally:
        sock.close()
    t0 = time.monotonic()
    gone = wait_until(lambda: _sleepers(client, sid) == 0, timeout=10, interval=0.2)
    assert gone, f"`sleep 1000` still runs {time.monotonic() - t0:.1f}s after the client hung up"
    # The sandbox itself is fine.
    assert client.sh(sid, "echo alive") == "alive\n"
    # The access log records the request as cut short by the client.
    rec = wait_until(lambda: shim.logs.find(
        lambda r: r.get("message") == "request" and r.get("sandbox_id") == sid
        and r.get("route") == "/sandboxes/{id}/exec"
        and (r.get("status") == 499 or r.get("completed") is False)), timeout=5)
    assert rec, shim.logs.text()[-3000:]


def _ndjson_post(shim, sid, body, timeout=30):
    conn = shim.connection(timeout=timeout)
    conn.request("POST", f"/sandboxes/{sid}/exec", body=json.dumps(body),
                 headers={**shim.auth_headers(), "Content-Type": "application/json",
                          "Accept": "application/x-ndjson"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp, data


def test_ndjson_validation_is_422(client, shim):
    sid = client.launch()
    resp, data = _ndjson_post(shim, sid, {"argv": []})
    assert resp.status == 422, (resp.status, data)
    assert json.loads(data)["detail"][0]["loc"] == ["body", "argv"]


def test_ndjson_unknown_sandbox_is_404(shim):
    """As without NDJSON: an unknown sandbox is a 404, not a 200 whose
    stream carries an error."""
    resp, data = _ndjson_post(shim, new_id("ghost"), {"argv": ["true"]})
    assert resp.status == 404, (resp.status, data)


def test_keep_alive_connection_serves_many_requests(client, shim):
    """An agent's HTTP pool reuses connections: answers (including errors)
    keep the connection usable, or say Connection: close."""
    sid = client.launch()
    conn = shim.connection(timeout=30)
    auth = {**shim.auth_headers(), "Content-Type": "application/json"}
    steps = [
        ("GET", "/health", None, {}, 200),
        ("POST", f"/sandboxes/{sid}/exec", {"argv": ["echo", "one"]}, auth, 200),
        ("POST", f"/sandboxes/{sid}/exec", {"argv": []}, auth, 422),
        ("GET", f"/sandboxes/{new_id('ghost')}/tar", None, auth, 404),
        ("POST", "/sandboxes", {"sandbox_id": "x"}, {"Content-Type": "application/json"}, 401),
        ("GET", f"/sandboxes/{sid}/tar", None, auth, 200),
        ("POST", f"/sandboxes/{sid}/exec", {"argv": ["echo", "two"]}, auth, 200),
    ]
    try:
        for method, path, body, headers, want in steps:
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == want, (method, path, resp.status, data)
            if resp.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = shim.connection(timeout=30)
    finally:
        conn.close()


def test_early_refusal_does_not_run_the_body_as_a_request(client, shim):
    """A 401 sent before the body is read must not let the body be parsed as
    a second (authenticated) request on the same connection."""
    sid = client.launch()
    inner = (f"DELETE /sandboxes/{sid} HTTP/1.1\r\nHost: x\r\n"
             f"Authorization: Bearer {shim.secret}\r\nContent-Length: 0\r\n\r\n").encode()
    sock = socket.create_connection((shim.host, shim.port), timeout=5)
    try:
        sock.sendall(b"POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(inner) + inner)
        data = b""
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                piece = sock.recv(65536)
            except socket.timeout:
                break
            if not piece:
                break
            data += piece
    finally:
        sock.close()
    assert data.startswith(b"HTTP/1.1 401"), data
    assert data.count(b"HTTP/1.1 ") == 1, data
    assert client.run(sid, ["true"])["exit_code"] == 0  # still there


@pytest.mark.parametrize("accept", ["application/json", "application/x-ndjson"])
def test_exec_silent_longer_than_connection_timeout(shims, gateway, accept):
    """SHIM_CONNECTION_TIMEOUT is about idle connections: a command that
    prints nothing for longer than it (here 2 s, by default 120 s while the
    default exec timeout is 1800 s) must still get its whole answer."""
    s = shims.shim(gateway, env={"SHIM_CONNECTION_TIMEOUT": "2"})
    c = ShimClient(s)
    try:
        sid = c.launch()
        conn = s.connection(timeout=30)
        try:
            conn.request("POST", f"/sandboxes/{sid}/exec",
                         body=json.dumps({"argv": ["sh", "-c", "echo a; sleep 4; echo done"], "timeout": 60}),
                         headers={**s.auth_headers(), "Content-Type": "application/json", "Accept": accept})
            resp = conn.getresponse()
            assert resp.status == 200
            data = resp.read()
        finally:
            conn.close()
        if accept == "application/json":
            body = json.loads(data)
            assert unb64(body["stdout_b64"]) == b"a\ndone\n" and body["exit_code"] == 0, body
        else:
            events = [json.loads(line) for line in data.splitlines()]
            out = b"".join(unb64(e["stdout_b64"]) for e in events if "stdout_b64" in e)
            assert out == b"a\ndone\n" and events[-1] == {"exit_code": 0, "timed_out": False}, events
        # An idle keep-alive connection, though, is closed after the timeout.
        conn = s.connection(timeout=10)
        try:
            conn.request("GET", "/health")
            conn.getresponse().read()
            time.sleep(3.5)
            with pytest.raises((ConnectionError, OSError)):
                conn.request("GET", "/health")
                conn.getresponse().read()
        finally:
            conn.close()
    finally:
        c.cleanup()
