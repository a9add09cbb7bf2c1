"""sandbox-shim: the REST routes of detached processes, against a real
gateway — start (always detached), list, describe, output (NDJSON, replayed
and/or followed), stdin (with EOF), signal (by name or number), resize of a
terminal; their errors (404, 405, 409, 413, 422, 429); and a client that
leaves a followed stream, which leaves the process running. Their bearer
check (401, 503) is in test_shim_contract.py with every other route's."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.lib.client import new_id
from tests.lib.procs import wait_until
from tests.lib.shim import (ShimClient, assert_validation_error, b64, health_ok, metric_value, raw_connect,
                            read_response_head, status_of, unb64)

SERVER = ["python3", "-u", "-m", "http.server", "8000", "--bind", "127.0.0.1"]
FETCH = ("import urllib.request, time\n"
         "for _ in range(100):\n"
         "    try:\n"
         "        print(urllib.request.urlopen('http://127.0.0.1:8000/').status); break\n"
         "    except OSError:\n"
         "        time.sleep(0.1)\n")
INFO_KEYS = {"process_id", "pid", "argv", "pty", "detached", "running", "started_at_ms", "output_dropped_bytes",
             "exit"}
MIB = 1024 * 1024
EXIT_KEYS = {"exit_code", "signal", "timed_out", "oom_killed", "pids_limited", "message"}


@pytest.fixture(scope="module")
def sid(shim):
    """One sandbox shared by the tests of this module (each uses its own
    process ids)."""
    c = ShimClient(shim)
    sandbox = c.launch(new_id("procs"))
    try:
        yield sandbox
    finally:
        c.cleanup()


def start(shim, sid, argv, **fields):
    return shim.request("POST", f"/sandboxes/{sid}/processes", {"argv": argv, **fields})


def started(shim, sid, argv, **fields) -> dict:
    r = start(shim, sid, argv, **fields)
    assert r.status == 201, r
    info = r.json()
    assert set(info) == INFO_KEYS, info
    # (A quick one may have exited already: then running is false.)
    assert info["detached"] is True and info["pid"] > 0, info
    return info


def describe(shim, sid, pid) -> dict:
    r = shim.request("GET", f"/sandboxes/{sid}/processes/{pid}")
    assert r.status == 200, r
    assert set(r.json()) == INFO_KEYS, r
    return r.json()


def exited(shim, sid, pid, timeout=10.0) -> dict:
    """The process's info once it has exited."""
    got = wait_until(lambda: (lambda i: i if not i["running"] else None)(describe(shim, sid, pid)), timeout)
    assert got, f"process {pid} still runs after {timeout} s"
    assert set(got["exit"]) == EXIT_KEYS, got
    return got


def events_of(body: bytes) -> list:
    assert body == b"" or body.endswith(b"\n"), body
    return [json.loads(line) for line in body.splitlines()]


def output(shim, sid, pid, query="", timeout=20.0) -> list:
    """The output route's events, read to the end of the response."""
    r = shim.request("GET", f"/sandboxes/{sid}/processes/{pid}/output{query}", timeout=timeout)
    assert r.status == 200, r
    assert r.headers["content-type"] == "application/x-ndjson", r.headers
    return events_of(r.body)


def text(events, stream="stdout") -> bytes:
    return b"".join(unb64(e[f"{stream}_b64"]) for e in events if f"{stream}_b64" in e)


def stdin(shim, sid, pid, data: bytes, close=False):
    q = "?close=true" if close else ""
    return shim.request("POST", f"/sandboxes/{sid}/processes/{pid}/stdin{q}", data,
                        headers={"Content-Type": "application/octet-stream"})


def signal(shim, sid, pid, sig):
    return shim.request("POST", f"/sandboxes/{sid}/processes/{pid}/signal", {"signal": sig})


# ---- start, list, describe, output, signal -------------------------------------------

def test_a_detached_server_is_started_listed_described_read_and_stopped(shim, client, sid):
    info = started(shim, sid, SERVER, process_id="web")
    assert info["process_id"] == "web" and info["argv"] == SERVER and info["running"] is True, info
    assert info["pty"] is None and info["exit"] is None and info["started_at_ms"] > 0, info
    assert info["output_dropped_bytes"] == 0, info

    # It outlived the request that started it: it serves.
    assert client.run(sid, ["python3", "-c", FETCH], timeout=60)["stdout"].strip() == "200"

    r = shim.request("GET", f"/sandboxes/{sid}/processes")
    assert r.status == 200 and set(r.json()) == {"processes"}, r
    listed = {p["process_id"]: p for p in r.json()["processes"]}
    assert listed["web"]["running"] and listed["web"]["pid"] == info["pid"], listed
    assert describe(shim, sid, "web")["argv"] == SERVER

    # Without follow: the buffered output (its request log), then the end;
    # no exit line while it runs.
    t0 = time.monotonic()
    events = output(shim, sid, "web")
    assert time.monotonic() - t0 < 5, "a read without follow waited"
    assert b"GET / HTTP" in text(events, "stderr"), events
    assert all(set(e) in ({"stdout_b64"}, {"stderr_b64"}) for e in events), events
    assert output(shim, sid, "web", "?replay=false") == []

    r = signal(shim, sid, "web", "SIGTERM")
    assert r.status == 204 and r.body == b"", r
    done = exited(shim, sid, "web")["exit"]
    assert (done["exit_code"], done["signal"], done["timed_out"]) == (-15, 15, False), done
    # Once it has exited, a read ends with the exit line.
    events = output(shim, sid, "web")
    assert events[-1]["signal"] == 15 and set(events[-1]) == EXIT_KEYS, events
    # It cannot be signalled again.
    r = signal(shim, sid, "web", "SIGTERM")
    assert r.status == 409 and "exited" in r.json()["detail"], r


def test_following_streams_output_as_it_comes_and_ends_with_the_exit(shim, client, sid):
    script = "echo first; while [ ! -f /tmp/go-follow ]; do sleep 0.05; done; echo second; echo err >&2; exit 3"
    info = started(shim, sid, ["sh", "-c", script])
    pid = info["process_id"]  # generated
    assert pid
    conn = shim.connection(timeout=20)
    try:
        conn.request("GET", f"/sandboxes/{sid}/processes/{pid}/output?follow=true", headers=shim.auth_headers())
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "application/x-ndjson"
        # The first line comes while the process still waits: streamed.
        first = json.loads(resp.readline())
        assert first == {"stdout_b64": b64("first\n")}, first
        client.sh(sid, "touch /tmp/go-follow")
        events = events_of(resp.read())
    finally:
        conn.close()
    assert events[-1]["exit_code"] == 3 and events[-1]["signal"] is None, events
    assert text(events) == b"second\n" and text(events, "stderr") == b"err\n", events
    # A follower that comes after the exit gets everything, then the exit.
    again = output(shim, sid, pid, "?follow=true")
    assert text(again) == b"first\nsecond\n" and again[-1]["exit_code"] == 3, again


def test_stdin_reaches_the_process_and_close_ends_it(shim, sid):
    started(shim, sid, ["cat"], process_id="cat")
    r = stdin(shim, sid, "cat", b"hello\n")
    assert r.status == 204 and r.body == b"", r
    r = stdin(shim, sid, "cat", b"")  # nothing to write: still fine
    assert r.status == 204, r
    r = stdin(shim, sid, "cat", b"world\n", close=True)
    assert r.status == 204, r
    done = exited(shim, sid, "cat")["exit"]
    assert done["exit_code"] == 0 and done["signal"] is None, done
    events = output(shim, sid, "cat")
    assert text(events) == b"hello\nworld\n" and events[-1]["exit_code"] == 0, events

    # Its input is over: 409 with the gateway's reason.
    r = stdin(shim, sid, "cat", b"late\n")
    assert r.status == 409, r
    assert "no more input" in r.json()["detail"], r


def test_stdin_close_without_bytes_and_the_body_cap(shim, sid):
    started(shim, sid, ["sh", "-c", "wc -c"], process_id="wc")
    url = f"/sandboxes/{sid}/processes/wc/stdin"
    # Declared over 1 MiB: refused from the headers, before the body.
    sock = raw_connect(shim)
    try:
        sock.sendall((f"POST {url} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {shim.secret}\r\n"
                      f"Content-Length: {MIB + 1}\r\n\r\n").encode())
        assert status_of(read_response_head(sock, 10)) == 413
    finally:
        sock.close()
    # Chunked, over 1 MiB while it arrives.
    conn = shim.connection(30)
    try:
        conn.request("POST", url, body=iter([b"y" * (MIB // 2), b"y" * MIB]), headers=shim.auth_headers(),
                     encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413, (resp.status, resp.read())
    finally:
        conn.close()
    r = stdin(shim, sid, "wc", b"x" * MIB)  # at the cap: taken
    assert r.status == 204, r
    r = stdin(shim, sid, "wc", b"", close=True)
    assert r.status == 204, r
    assert exited(shim, sid, "wc")["exit"]["exit_code"] == 0
    assert text(output(shim, sid, "wc")).strip() == str(MIB).encode()


@pytest.mark.parametrize("sig,number", [(9, 9), ("int", 2), ("SigKill", 9), ("15", 15), ("HUP", 1)])
def test_signal_by_number_or_name(shim, sid, sig, number):
    pid = f"sig{number}-{new_id('p')[-6:]}"
    started(shim, sid, ["sleep", "1000"], process_id=pid)
    r = signal(shim, sid, pid, sig)
    assert r.status == 204, r
    done = exited(shim, sid, pid)["exit"]
    assert done["signal"] == number and done["exit_code"] == -number, done


def test_env_cwd_and_timeout_reach_the_process(shim, sid):
    started(shim, sid, ["sh", "-c", "echo $GREETING; pwd"], env={"GREETING": "hi there"}, cwd="/tmp",
            process_id="envcwd")
    assert exited(shim, sid, "envcwd")["exit"]["exit_code"] == 0
    assert text(output(shim, sid, "envcwd")) == b"hi there\n/tmp\n"

    started(shim, sid, ["sleep", "1000"], timeout=1, process_id="slow")
    done = exited(shim, sid, "slow", timeout=15)["exit"]
    assert done["timed_out"] is True, done


def test_resize_reaches_the_terminal(shim, sid):
    info = started(shim, sid, ["sh", "-c", "stty size; read x; stty size"], pty={"rows": 24, "cols": 80},
                   process_id="tty")
    assert info["pty"] == {"rows": 24, "cols": 80}, info
    assert wait_until(lambda: b"24 80" in text(output(shim, sid, "tty")), timeout=10), output(shim, sid, "tty")
    r = shim.request("POST", f"/sandboxes/{sid}/processes/tty/resize", {"rows": 30, "cols": 100})
    assert r.status == 204 and r.body == b"", r
    assert stdin(shim, sid, "tty", b"go\n").status == 204
    assert exited(shim, sid, "tty")["exit"]["exit_code"] == 0
    assert b"30 100" in text(output(shim, sid, "tty"))

    # Without a terminal: the gateway's INVALID_ARGUMENT, a 422 naming why.
    started(shim, sid, ["sleep", "1000"], process_id="notty")
    r = shim.request("POST", f"/sandboxes/{sid}/processes/notty/resize", {"rows": 30, "cols": 100})
    assert r.status == 422 and "no terminal" in r.json()["detail"], r
    assert signal(shim, sid, "notty", "KILL").status == 204


# ---- errors -----------------------------------------------------------------------------

def test_unknown_process_or_sandbox_is_404(shim, sid):
    base = f"/sandboxes/{sid}/processes/nosuch"
    for method, path, body in [
        ("GET", base, None),
        ("GET", f"{base}/output", None),
        ("GET", f"{base}/output?follow=true", None),
        ("POST", f"{base}/stdin", b"x"),
        ("POST", f"{base}/signal", {"signal": "TERM"}),
        ("POST", f"{base}/resize", {"rows": 1, "cols": 1}),
        ("GET", "/sandboxes/nosuch-sandbox/processes", None),
        ("POST", "/sandboxes/nosuch-sandbox/processes", {"argv": ["true"]}),
        ("GET", "/sandboxes/nosuch-sandbox/processes/p/output", None),
    ]:
        r = shim.request(method, path, body)
        assert r.status == 404, (method, path, r)
        detail = r.json()["detail"]
        assert "not found" in detail or "no process `" in detail, (method, path, r)


def test_a_taken_process_id_is_409(shim, sid):
    started(shim, sid, ["sleep", "1000"], process_id="twice")
    r = start(shim, sid, ["sleep", "1000"], process_id="twice")
    assert r.status == 409 and "twice" in r.json()["detail"], r
    assert signal(shim, sid, "twice", 9).status == 204


def test_bad_requests_are_422(shim, sid):
    url = f"/sandboxes/{sid}/processes"
    r = shim.request("POST", url, "{not json", headers={"Content-Type": "application/json"})
    assert_validation_error(r, ["body"])
    assert_validation_error(shim.request("POST", url, {"env": {}}), ["body", "argv"])
    assert_validation_error(start(shim, sid, []), ["body", "argv"])
    assert_validation_error(start(shim, sid, ["true"], env={"A": 1}), ["body", "env", "A"])
    assert_validation_error(start(shim, sid, ["true"], env=["A=1"]), ["body", "env"])
    assert_validation_error(start(shim, sid, ["true"], cwd=5), ["body", "cwd"])
    assert_validation_error(start(shim, sid, ["true"], timeout=3601), ["body", "timeout"])
    assert_validation_error(start(shim, sid, ["true"], timeout=-1), ["body", "timeout"])
    assert_validation_error(start(shim, sid, ["true"], pty={"rows": 0, "cols": 80}), ["body", "pty", "rows"])
    assert_validation_error(start(shim, sid, ["true"], pty={"rows": 24}), ["body", "pty", "cols"])
    assert_validation_error(start(shim, sid, ["true"], process_id="bad id"), ["body", "process_id"])
    assert_validation_error(start(shim, sid, ["true"], process_id="x" * 65), ["body", "process_id"])
    # The gateway's own checks come back as 422 too (a relative cwd).
    r = start(shim, sid, ["true"], cwd="relative")
    assert r.status == 422 and "cwd" in r.json()["detail"], r

    sig_url = f"/sandboxes/{sid}/processes/any/signal"
    for bad in ["SIGFOO", "", 0, 65, -1, True, None, [15]]:
        assert_validation_error(shim.request("POST", sig_url, {"signal": bad}), ["body", "signal"])
    assert_validation_error(shim.request("POST", sig_url, {}), ["body", "signal"])
    resize_url = f"/sandboxes/{sid}/processes/any/resize"
    assert_validation_error(shim.request("POST", resize_url, {"rows": 0, "cols": 10}), ["body", "rows"])
    assert_validation_error(shim.request("POST", resize_url, {"rows": 10, "cols": 70000}), ["body", "cols"])
    assert_validation_error(shim.request("POST", resize_url, {"rows": 10}), ["body", "cols"])

    assert_validation_error(shim.request("GET", f"{url}/bad.id"), ["path", "process_id"])
    assert_validation_error(shim.request("GET", f"{url}/{'p' * 65}/output"), ["path", "sandbox_id"])
    assert_validation_error(shim.request("GET", f"{url}/any/output?follow=maybe"), ["query", "follow"])
    assert_validation_error(shim.request("GET", f"{url}/any/output?replay=2"), ["query", "replay"])
    assert_validation_error(shim.request("POST", f"{url}/any/stdin?close=maybe", b"x"), ["query", "close"])


def test_wrong_methods_and_paths_under_processes(shim, sid):
    base = f"/sandboxes/{sid}/processes"
    for method, path in [("DELETE", base), ("PUT", f"{base}/p"), ("POST", f"{base}/p/output"),
                         ("GET", f"{base}/p/stdin")]:
        r = shim.request(method, path)
        assert r.status == 405, (method, path, r)
    for path in [f"{base}/", f"{base}/p/x", f"{base}/p/output/"]:
        r = shim.request("GET", path)
        assert r.status == 404 and r.json() == {"detail": "Not Found"}, (path, r)


def test_the_65th_running_process_is_429(shim, client):
    sandbox = client.launch(new_id("many"))
    for i in range(64):
        r = start(shim, sandbox, ["sleep", "1000"], process_id=f"s{i}")
        assert r.status == 201, (i, r)
    r = start(shim, sandbox, ["sleep", "1000"], process_id="s64")
    assert r.status == 429 and "64" in r.json()["detail"], r
    r = shim.request("GET", f"/sandboxes/{sandbox}/processes")
    assert r.status == 200 and len(r.json()["processes"]) == 64, r
    # An exited one frees its place.
    assert signal(shim, sandbox, "s0", "KILL").status == 204
    exited(shim, sandbox, "s0")
    assert start(shim, sandbox, ["sleep", "1000"], process_id="s64").status == 201
    assert client.delete(sandbox).status == 204


# ---- a vanished client -------------------------------------------------------------------

def test_a_client_leaving_a_followed_stream_leaves_the_process_running(shim, sid):
    started(shim, sid, ["sh", "-c", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.1; done"],
            process_id="ticker")
    sock = socket.create_connection((shim.host, shim.port), timeout=10)
    try:
        sock.sendall((f"GET /sandboxes/{sid}/processes/ticker/output?follow=true HTTP/1.1\r\n"
                      f"Host: 127.0.0.1\r\nAuthorization: Bearer {shim.secret}\r\n\r\n").encode())
        got = b""
        while got.count(b"stdout_b64") < 3:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
    finally:
        sock.close()
    # The attachment ended; the process did not.
    time.sleep(0.5)
    assert describe(shim, sid, "ticker")["running"] is True
    assert health_ok(shim)
    before = text(output(shim, sid, "ticker"))
    assert wait_until(lambda: len(text(output(shim, sid, "ticker"))) > len(before), timeout=5)
    assert signal(shim, sid, "ticker", "TERM").status == 204
    assert exited(shim, sid, "ticker")["exit"]["signal"] == 15


def test_process_routes_are_metrics_labels(shim, sid):
    started(shim, sid, ["true"], process_id="metered")
    output(shim, sid, "metered")
    r = shim.request("GET", "/metrics")
    assert r.status == 200, r
    assert metric_value(r.body.decode(), "shim_requests_total",
                        {"method": "GET", "route": "/sandboxes/{id}/processes/{pid}/output", "status": "200"}) >= 1
