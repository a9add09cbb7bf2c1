"""sandbox-shim: the REST contract, row by row, against a real gateway.

Every status code of the contract, every validation case (FastAPI-shaped
422s), the bearer check (of every route, the process routes too), the
extensions (snapshot, connect, list, metrics), the output cap, the access
log, and 502 when the gateway is unreachable.
"""

from __future__ import annotations

import io
import json
import re
import os
import tarfile
import tempfile
import time

import pytest

from tests.lib.client import new_id
from tests.lib.procs import free_port, wait_until
from tests.lib.shim import (BAD_TOKEN, NOT_CONFIGURED, ShimClient, assert_validation_error, metric_value,
                            unb64)

TAR = {"Content-Type": "application/x-tar"}


@pytest.fixture(scope="module")
def sandbox(shim):
    """One sandbox shared by the read-only tests of this module."""
    c = ShimClient(shim)
    sid = c.launch(new_id("shared"))
    try:
        yield sid
    finally:
        c.cleanup()


def small_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# Every authenticated route, with a request that would otherwise be valid.
AUTH_ROUTES = [
    ("POST", "/sandboxes", {"sandbox_id": "authcheck"}),
    ("GET", "/sandboxes", None),
    ("DELETE", "/sandboxes/authcheck", None),
    ("POST", "/sandboxes/authcheck/exec", {"argv": ["true"]}),
    ("POST", "/sandboxes/authcheck/restore", b"x" * 2048),
    ("GET", "/sandboxes/authcheck/tar", None),
    ("POST", "/sandboxes/authcheck/snapshot", None),
    ("POST", "/sandboxes/authcheck/connect", None),
    ("GET", "/sandboxes/authcheck/processes/p/terminal", None),
    ("POST", "/sandboxes/authcheck/processes", {"argv": ["true"]}),
    ("GET", "/sandboxes/authcheck/processes", None),
    ("GET", "/sandboxes/authcheck/processes/p", None),
    ("GET", "/sandboxes/authcheck/processes/p/output", None),
    ("POST", "/sandboxes/authcheck/processes/p/stdin", b"x"),
    ("POST", "/sandboxes/authcheck/processes/p/signal", {"signal": "TERM"}),
    ("POST", "/sandboxes/authcheck/processes/p/resize", {"rows": 1, "cols": 1}),
    ("GET", "/sandboxes/authcheck/files?path=/etc/hostname", None),
    ("PUT", "/sandboxes/authcheck/files?path=/tmp/x", b"x"),
    ("DELETE", "/sandboxes/authcheck/files?path=/tmp/x", None),
    ("GET", "/sandboxes/authcheck/files/stat?path=/tmp", None),
    ("GET", "/sandboxes/authcheck/files/list?path=/tmp", None),
    ("POST", "/sandboxes/authcheck/files/rename", {"from": "/tmp/a", "to": "/tmp/b"}),
    ("POST", "/sandboxes/authcheck/files/mkdir", {"path": "/tmp/d"}),
    ("GET", "/sandboxes/authcheck/files/watch?path=/tmp", None),
    ("GET", "/metrics", None),
    ("GET", "/sandboxes/authcheck/ports", None),
    ("POST", "/sandboxes/authcheck/ports/8000/links", {"ttl_seconds": 60}),
    ("GET", "/sandboxes/authcheck/ports/8000", None),
    ("GET", "/sandboxes/authcheck/ports/8000/", None),
    ("POST", "/sandboxes/authcheck/ports/8000/x", b"x"),
    ("GET", "/sandboxes/authcheck", None),
]
AUTH_IDS = [f"{m} {p}" for m, p, _ in AUTH_ROUTES]


# ---- /health -------------------------------------------------------------------

def test_health_needs_no_token_and_reports_gateway(shim):
    for auth in (False, True):
        r = shim.request("GET", "/health", auth=auth)
        assert r.status == 200, r
        assert r.headers["content-type"].startswith("application/json")
        assert r.json() == {"cli_mounted": True, "allow_egress": False}
    r = shim.request("GET", "/health", token="wrong")
    assert r.status == 200 and r.json()["cli_mounted"] is True, r


def test_health_reports_allow_egress(shims):
    gw = shims.gateway({"ALLOW_EGRESS": "true"}, secret="egress-secret")
    s = shims.shim(gw)
    r = s.request("GET", "/health", auth=False)
    assert r.status == 200 and r.json() == {"cli_mounted": True, "allow_egress": True}, r


def test_health_without_gateway_is_not_mounted(shims):
    s = shims.shim(target=f"127.0.0.1:{free_port()}", secret="x")
    r = s.request("GET", "/health", auth=False, timeout=30)
    assert r.status == 200 and r.json() == {"cli_mounted": False, "allow_egress": False}, r


# ---- bearer check -----------------------------------------------------------------

@pytest.mark.parametrize("method,path,body", AUTH_ROUTES, ids=AUTH_IDS)
def test_missing_token_is_401(shim, method, path, body):
    r = shim.request(method, path, body, auth=False, headers=TAR if "restore" in path else None)
    assert r.status == 401 and r.json() == BAD_TOKEN, r


@pytest.mark.parametrize("method,path,body", AUTH_ROUTES, ids=AUTH_IDS)
def test_wrong_token_is_401(shim, method, path, body):
    r = shim.request(method, path, body, token="not-the-secret",
                     headers=TAR if "restore" in path else None)
    assert r.status == 401 and r.json() == BAD_TOKEN, r


@pytest.mark.parametrize("header", [
    "Basic {s}", "Bearer", "Bearer ", "{s}", "Bearer {s}x", "Bearer x{s}", "Token {s}", "Bearer{s}",
])
def test_malformed_authorization_is_401(shim, header):
    r = shim.request("GET", "/sandboxes", auth=False,
                     headers={"Authorization": header.format(s=shim.secret)})
    assert r.status == 401 and r.json() == BAD_TOKEN, r


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_bearer_scheme_is_case_insensitive(shim, scheme):
    r = shim.request("GET", "/sandboxes", auth=False,
                     headers={"Authorization": f"{scheme} {shim.secret}"})
    assert r.status == 200, r


def test_auth_checked_before_validation(shim):
    """A bad token on an invalid request is still a 401, not a 422 (nothing
    about the request is revealed to an unauthenticated client)."""
    r = shim.request("POST", "/sandboxes/--evil/exec", {"argv": []}, token="nope")
    assert r.status == 401 and r.json() == BAD_TOKEN, r


@pytest.mark.parametrize("secret", [None, ""], ids=["unset", "empty"])
def test_secret_not_configured_is_503(shims, gateway, secret):
    s = shims.shim(target=gateway.target, secret=secret,
                   env={"SHIM_GATEWAY_SECRET": gateway.secret})
    for method, path, body in AUTH_ROUTES:
        for token in (None, "anything", ""):
            r = s.request(method, path, body, token=token, auth=token is not None,
                          headers=TAR if "restore" in path else None)
            assert r.status == 503 and r.json() == NOT_CONFIGURED, (method, path, token, r)
    r = s.request("GET", "/health", auth=False)
    assert r.status == 200 and r.json() == {"cli_mounted": True, "allow_egress": False}, r


# ---- unknown paths, wrong methods ---------------------------------------------------

@pytest.mark.parametrize("path", ["/", "/nope", "/sandboxes/a/b", "/sandboxes/a/exec/x", "/healthz",
                                  "/sandboxes/a/execute"])
def test_unknown_path_is_404(shim, path):
    for method in ("GET", "POST"):
        r = shim.request(method, path)
        assert r.status == 404 and r.json() == {"detail": "Not Found"}, (method, path, r)


@pytest.mark.parametrize("method,path", [
    ("PUT", "/sandboxes"), ("DELETE", "/sandboxes"), ("POST", "/health"), ("DELETE", "/health"),
    ("GET", "/sandboxes/a/exec"), ("PUT", "/sandboxes/a"), ("POST", "/sandboxes/a"),
    ("POST", "/sandboxes/a/tar"), ("GET", "/sandboxes/a/restore"), ("POST", "/metrics"),
])
def test_wrong_method_is_405(shim, method, path):
    r = shim.request(method, path)
    assert r.status == 405, r
    assert r.json() == {"detail": "Method Not Allowed"}, r


# ---- POST /sandboxes ----------------------------------------------------------------

def test_launch_201_then_duplicate_409(shim, client):
    sid = new_id()
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid})
    client.created.add(sid)
    assert r.status == 201, r
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"sandbox_id": sid}
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid})
    assert r.status == 409, r
    assert isinstance(r.json()["detail"], str)


@pytest.mark.parametrize("egress", [True, False, "true", 0, None])
def test_launch_allow_egress_values(client, shim, egress):
    sid = new_id()
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid, "allow_egress": egress})
    client.created.add(sid)
    # This gateway forbids egress: asking for it adds "allow_egress": false
    # (additive; tests/integration/test_shim_exec_parity.py).
    asked = egress in (True, "true")
    expected = {"sandbox_id": sid, "allow_egress": False} if asked else {"sandbox_id": sid}
    assert r.status == 201 and r.json() == expected, r


def test_launch_id_limits(client):
    """One character and 64 characters are valid ids; `_` and `-` are
    allowed after the first character."""
    for sid in ("a", "Z9", "a_b-c", "x" * 64):
        client.launch(sid)
        assert client.delete(sid).status == 204


def test_launch_failure_is_502_with_reason(shims):
    rootfs = tempfile.mkdtemp(prefix="shim-rootfs-")
    gw = shims.gateway({"SANDBOX_ROOTFS": rootfs}, secret="launch-fail")
    os.rmdir(rootfs)  # every launch now fails to mount its overlay
    s = shims.shim(gw)
    r = s.request("POST", "/sandboxes", {"sandbox_id": "doomed"})
    assert r.status == 502, r
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "No such file or directory" in detail, r


BAD_IDS = ["--evil", "x" * 65, "a.b", "_a", "-a", "a b", "a/b", "é", "a;b", "a$b"]


@pytest.mark.parametrize("sid", BAD_IDS + [""])
def test_launch_bad_id_is_422(shim, sid):
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid})
    assert_validation_error(r, ["body", "sandbox_id"])


@pytest.mark.parametrize("body,loc", [
    ({}, ["body", "sandbox_id"]),
    ({"sandbox_id": 5}, ["body", "sandbox_id"]),
    ({"sandbox_id": None}, ["body", "sandbox_id"]),
    ({"sandbox_id": ["a"]}, ["body", "sandbox_id"]),
    ({"sandbox_id": "ok", "allow_egress": "maybe"}, ["body", "allow_egress"]),
    ({"sandbox_id": "ok", "allow_egress": 2}, ["body", "allow_egress"]),
    ({"sandbox_id": "ok", "allow_egress": []}, ["body", "allow_egress"]),
    ({"sandbox_id": "ok", "allow_egress": {}}, ["body", "allow_egress"]),
    ([{"sandbox_id": "ok"}], None),
    ("just a string", None),
])
def test_launch_bad_body_is_422(shim, body, loc):
    r = shim.request("POST", "/sandboxes", body if not isinstance(body, str) else json.dumps(body),
                     headers={"Content-Type": "application/json"})
    assert_validation_error(r, loc)


@pytest.mark.parametrize("raw,ctype", [
    ('{"sandbox_id": "ok"', "application/json"),
    ("{'sandbox_id': 'ok'}", "application/json"),
    ("", "application/json"),
    ("sandbox_id=ok", "application/x-www-form-urlencoded"),
    ('{"sandbox_id": "ok"}', "text/plain"),
    ('{"sandbox_id": "ok"}', "application/x-www-form-urlencoded"),
], ids=["truncated", "single-quotes", "empty", "form", "text-plain", "json-as-form"])
def test_launch_malformed_body_is_422(shim, client, raw, ctype):
    r = shim.request("POST", "/sandboxes", raw, headers={"Content-Type": ctype})
    client.created.add("ok")  # in case the shim wrongly launched it
    errors = assert_validation_error(r)
    # A body of another type says so (FastAPI's type, a message that names the fix).
    if raw and "json" not in ctype:
        assert errors[0]["type"] == "model_attributes_type", errors
        assert "Content-Type: application/json" in errors[0]["msg"], errors


# ---- POST /sandboxes/{id}/exec ----------------------------------------------------------

def test_exec_200_shape(client, sandbox):
    r = client.exec(sandbox, ["sh", "-c", "printf out; printf err >&2; exit 3"])
    assert r.status == 200, r
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"stdout_b64", "stderr_b64", "exit_code", "timed_out"}, body
    assert unb64(body["stdout_b64"]) == b"out"
    assert unb64(body["stderr_b64"]) == b"err"
    assert body["exit_code"] == 3 and body["timed_out"] is False


def test_exec_default_timeout_and_binary_output(client, sandbox):
    r = client.exec(sandbox, ["sh", "-c", r"printf '\000\377\001'"])
    assert r.status == 200, r
    assert unb64(r.json()["stdout_b64"]) == b"\x00\xff\x01"
    assert r.json()["exit_code"] == 0


def test_exec_killed_by_signal_is_negative(client, sandbox):
    for sig in (9, 15):
        body = client.run(sandbox, ["sh", "-c", f"kill -{sig} $$"])
        assert body["exit_code"] == -sig and body["timed_out"] is False, body


def test_exec_timeout(client, sandbox):
    t0 = time.monotonic()
    body = client.run(sandbox, ["sh", "-c", "echo before; sleep 30"], timeout=1)
    assert time.monotonic() - t0 < 15
    assert body["timed_out"] is True and body["exit_code"] is None, body
    assert body["stdout"] == "before\n"


def test_exec_missing_command_is_exit_127(client, sandbox):
    body = client.run(sandbox, ["/no/such/program"])
    assert body["exit_code"] == 127 and body["timed_out"] is False, body


def test_exec_unknown_sandbox_is_404(client):
    r = client.exec(new_id("ghost"), ["true"])
    assert r.status == 404, r
    assert isinstance(r.json()["detail"], str)


@pytest.mark.parametrize("timeout", [1, 3600, "7", 5.0])
def test_exec_timeout_bounds_accepted(client, sandbox, timeout):
    r = client.shim.request("POST", f"/sandboxes/{sandbox}/exec", {"argv": ["true"], "timeout": timeout})
    assert r.status == 200 and r.json()["exit_code"] == 0, r


@pytest.mark.parametrize("body,loc", [
    ({}, ["body", "argv"]),
    ({"argv": []}, ["body", "argv"]),
    ({"argv": "ls"}, ["body", "argv"]),
    ({"argv": None}, ["body", "argv"]),
    ({"argv": [1]}, ["body", "argv"]),
    ({"argv": ["ls", 2]}, ["body", "argv"]),
    ({"argv": [None]}, ["body", "argv"]),
    ({"argv": [["ls"]]}, ["body", "argv"]),
    ({"argv": ["true"], "timeout": 0}, ["body", "timeout"]),
    ({"argv": ["true"], "timeout": -1}, ["body", "timeout"]),
    ({"argv": ["true"], "timeout": 3601}, ["body", "timeout"]),
    ({"argv": ["true"], "timeout": 10 ** 12}, ["body", "timeout"]),
    ({"argv": ["true"], "timeout": "abc"}, ["body", "timeout"]),
    ({"argv": ["true"], "timeout": 1.5}, ["body", "timeout"]),
    ({"argv": ["true"], "timeout": [5]}, ["body", "timeout"]),
    ([["true"]], None),
], ids=lambda v: json.dumps(v) if not isinstance(v, list) or v and v[0] != "body" else None)
def test_exec_bad_body_is_422(client, sandbox, body, loc):
    r = client.shim.request("POST", f"/sandboxes/{sandbox}/exec", body)
    assert_validation_error(r, loc)


@pytest.mark.parametrize("raw,ctype", [
    ('{"argv": ["true"]', "application/json"),
    ("not json", "application/json"),
    ("", "application/json"),
    ("argv=true", "application/x-www-form-urlencoded"),
    ('{"argv": ["true"]}', "application/x-www-form-urlencoded"),
    ('{"argv": ["true"]}', "text/plain"),
    ('{"argv": ["true"], "argv": ["false"]}', "application/json"),
], ids=["truncated", "not-json", "empty", "form", "json-as-form", "text-plain", "duplicate-key"])
def test_exec_malformed_body_is_422(client, sandbox, raw, ctype):
    r = client.shim.request("POST", f"/sandboxes/{sandbox}/exec", raw, headers={"Content-Type": ctype})
    assert_validation_error(r)


def test_exec_validation_before_lookup(client):
    """An invalid body on an unknown sandbox is a 422 (as FastAPI validates
    before the handler runs)."""
    r = client.shim.request("POST", f"/sandboxes/{new_id('ghost')}/exec", {"argv": []})
    assert_validation_error(r, ["body", "argv"])


def test_exec_json_content_type_with_charset(client, sandbox):
    r = client.shim.request("POST", f"/sandboxes/{sandbox}/exec", json.dumps({"argv": ["true"]}),
                            headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status == 200, r


# ---- bad ids in the path -------------------------------------------------------------------

PATH_ROUTES = [
    ("POST", "/sandboxes/{}/exec", {"argv": ["true"]}),
    ("GET", "/sandboxes/{}/tar", None),
    ("DELETE", "/sandboxes/{}", None),
    ("POST", "/sandboxes/{}/restore", b"x" * 2048),
    ("POST", "/sandboxes/{}/snapshot", None),
    ("POST", "/sandboxes/{}/connect", None),
    ("GET", "/sandboxes/{}/processes/p/terminal", None),
]
PATH_BAD_IDS = ["--evil", "x" * 65, "x" * 300, "a.b", "_a", "-a", "a%20b", "%2e%2e", "a%3Bb"]


@pytest.mark.parametrize("sid", PATH_BAD_IDS)
@pytest.mark.parametrize("method,tmpl,body", PATH_ROUTES, ids=[f"{m} {p}" for m, p, _ in PATH_ROUTES])
def test_bad_path_id_is_422(shim, method, tmpl, body, sid):
    r = shim.request(method, tmpl.format(sid), body, headers=TAR if "restore" in tmpl else None)
    assert_validation_error(r, ["path", "sandbox_id"])


def test_path_id_of_64_chars_is_valid(client):
    r = client.exec("y" * 64, ["true"])
    assert r.status == 404, r  # valid id, no such sandbox


# ---- restore, tar, delete -------------------------------------------------------------------

def test_restore_201_and_content(client, shim):
    sid = new_id("rest")
    data = small_tar({"tmp/hello.txt": b"restored!\n"})
    r = shim.request("POST", f"/sandboxes/{sid}/restore", data, headers=TAR)
    client.created.add(sid)
    assert r.status == 201, r
    assert r.json() == {"sandbox_id": sid}
    assert client.sh(sid, "cat /tmp/hello.txt") == "restored!\n"


@pytest.mark.parametrize("q,ok", [("true", True), ("false", True), ("1", True), ("no", True),
                                  ("maybe", False), ("", False), ("2", False)])
def test_restore_allow_egress_query(client, shim, q, ok):
    sid = new_id("rq")
    r = shim.request("POST", f"/sandboxes/{sid}/restore?allow_egress={q}",
                     small_tar({"tmp/x": b"x"}), headers=TAR)
    client.created.add(sid)
    if ok:
        assert r.status == 201, r
    else:
        assert_validation_error(r, ["query", "allow_egress"])


def test_restore_empty_body_is_422(client, shim):
    sid = new_id("rempty")
    r = shim.request("POST", f"/sandboxes/{sid}/restore", b"", headers=TAR)
    client.created.add(sid)
    assert_validation_error(r)
    # Nothing was created.
    assert client.exec(sid, ["true"]).status == 404


def test_restore_without_body_is_422(client, shim):
    sid = new_id("rnobody")
    r = shim.request("POST", f"/sandboxes/{sid}/restore", None, headers=TAR)
    client.created.add(sid)
    assert_validation_error(r)


def test_restore_existing_sandbox_is_409(client, sandbox):
    r = client.shim.request("POST", f"/sandboxes/{sandbox}/restore", small_tar({"tmp/x": b"x"}),
                            headers=TAR)
    assert r.status == 409, r


def test_restore_over_limit_is_413(shims, gateway):
    limit = 16384
    s = shims.shim(gateway, env={"SHIM_MAX_RESTORE_BYTES": str(limit)})
    c = ShimClient(s)
    try:
        # Declared too large: refused from the headers.
        sid = new_id("big")
        c.created.add(sid)
        r = s.request("POST", f"/sandboxes/{sid}/restore", b"\0" * (limit + 1), headers=TAR)
        assert r.status == 413, r
        assert isinstance(r.json()["detail"], str)
        # Chunked (no Content-Length), over the limit while streaming.
        sid = new_id("big")
        c.created.add(sid)
        conn = s.connection(30)
        try:
            conn.request("POST", f"/sandboxes/{sid}/restore",
                         body=iter([b"\0" * (limit // 2), b"\0" * limit]),
                         headers={**s.auth_headers(), **TAR}, encode_chunked=True)
            resp = conn.getresponse()
            assert resp.status == 413, (resp.status, resp.read())
        finally:
            conn.close()
        # At the limit: accepted.
        sid = new_id("fits")
        c.created.add(sid)
        data = small_tar({"tmp/ok": b"ok"})
        assert len(data) <= limit
        r = s.request("POST", f"/sandboxes/{sid}/restore", data, headers=TAR)
        assert r.status == 201, r
    finally:
        c.cleanup()


def test_restore_file_and_proxy_bodies_have_each_their_own_cap(shims, gateway):
    """SHIM_MAX_RESTORE_BYTES caps restores only; a file PUT is capped by
    SHIM_MAX_FILE_UPLOAD_BYTES (declared or streamed), a request into a
    sandbox's port by SHIM_MAX_PROXY_BODY_BYTES (refused from its
    declared length, before the gateway is asked)."""
    small, large = 16384, 65536
    s = shims.shim(gateway, env={"SHIM_MAX_RESTORE_BYTES": str(small), "SHIM_MAX_FILE_UPLOAD_BYTES": str(large),
                                 "SHIM_MAX_PROXY_BODY_BYTES": str(small)})
    c = ShimClient(s)
    try:
        sid = c.launch()
        data = os.urandom(2 * small)
        r = s.request("PUT", f"/sandboxes/{sid}/files?path=/tmp/f", data, headers={"Content-Type": "application/octet-stream"})
        assert r.status == 201, r
        assert c.sh(sid, "wc -c < /tmp/f").strip() == str(len(data))
        r = s.request("PUT", f"/sandboxes/{sid}/files?path=/tmp/g", b"\0" * (large + 1))
        assert r.status == 413, r
        conn = s.connection(30)
        try:
            conn.request("PUT", f"/sandboxes/{sid}/files?path=/tmp/h", body=iter([b"\0" * small] * 5),
                         headers=s.auth_headers(), encode_chunked=True)
            resp = conn.getresponse()
            assert resp.status == 413, (resp.status, resp.read())
        finally:
            conn.close()
        r = s.request("POST", f"/sandboxes/{new_id('big')}/restore", b"\0" * (small + 1), headers=TAR)
        assert r.status == 413, r
        r = s.request("POST", f"/sandboxes/{sid}/ports/8000/x", b"x" * (small + 1))
        assert r.status == 413, r
        r = s.request("POST", f"/sandboxes/{sid}/ports/8000/x", b"x" * small)
        assert r.status == 502 and "Nothing listens" in r.json()["detail"], r
    finally:
        c.cleanup()


def test_refused_restore_leaves_no_sandbox(shims, gateway):
    """A restore answered 413 must not create the sandbox, even when the
    part that was streamed before the limit is a complete tar."""
    limit = 16384
    s = shims.shim(gateway, env={"SHIM_MAX_RESTORE_BYTES": str(limit)})
    c = ShimClient(s)
    try:
        leaked = []
        for i in range(8):
            sid = new_id("refused")
            c.created.add(sid)
            conn = s.connection(30)
            try:
                conn.request("POST", f"/sandboxes/{sid}/restore",
                             body=iter([small_tar({"tmp/a": b"a" * 3000}), b"\0" * limit]),
                             headers={**s.auth_headers(), **TAR}, encode_chunked=True)
                resp = conn.getresponse()
                assert resp.status == 413, (resp.status, resp.read())
                resp.read()
            finally:
                conn.close()
            time.sleep(0.3)
            if c.exec(sid, ["true"]).status != 404:
                leaked.append(sid)
        assert not leaked, f"sandboxes created by restores answered 413: {leaked}"
    finally:
        c.cleanup()


def test_aborted_restore_upload_leaves_no_sandbox(client, shim):
    """A client that hangs up mid-upload (fewer bytes than its
    Content-Length) gets no sandbox, even if the bytes it sent happen to
    form a complete tar."""
    import socket
    data = small_tar({"tmp/b": b"b" * 100})
    leaked = []
    for i in range(3):
        sid = new_id("aborted")
        client.created.add(sid)
        sock = socket.create_connection((shim.host, shim.port), timeout=10)
        try:
            sock.sendall((f"POST /sandboxes/{sid}/restore HTTP/1.1\r\nHost: x\r\n"
                          f"Authorization: Bearer {shim.secret}\r\nContent-Type: application/x-tar\r\n"
                          f"Content-Length: {len(data) + 100000}\r\n\r\n").encode() + data)
            time.sleep(0.3)
        finally:
            sock.close()
        time.sleep(0.3)
        if client.exec(sid, ["true"]).status != 404:
            leaked.append(sid)
    assert not leaked, f"sandboxes created from aborted uploads: {leaked}"


def test_restore_not_a_tar_is_an_error(client, shim):
    sid = new_id("garbage")
    r = shim.request("POST", f"/sandboxes/{sid}/restore", b"this is not a tar" * 200, headers=TAR)
    client.created.add(sid)
    assert 400 <= r.status < 600 and r.status not in (200, 201), r
    assert isinstance(r.json()["detail"], (str, list))


def test_tar_200_chunked(client, sandbox):
    client.sh(sandbox, "echo tarred > /tmp/tarred.txt")
    conn = client.shim.connection(60)
    try:
        conn.request("GET", f"/sandboxes/{sandbox}/tar", headers=client.shim.auth_headers())
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type") == "application/x-tar"
        assert resp.getheader("Transfer-Encoding", "").lower() == "chunked"
        data = resp.read()
    finally:
        conn.close()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as t:
        member = t.getmember("tmp/tarred.txt")
        assert t.extractfile(member).read() == b"tarred\n"


def test_tar_unknown_sandbox_is_404(shim):
    r = shim.request("GET", f"/sandboxes/{new_id('ghost')}/tar")
    assert r.status == 404, r
    assert r.headers["content-type"].startswith("application/json")


def test_delete_204_then_404(client):
    sid = client.launch()
    r = client.shim.request("DELETE", f"/sandboxes/{sid}")
    assert r.status == 204 and r.body == b"", r
    r = client.shim.request("DELETE", f"/sandboxes/{sid}")
    assert r.status == 404, r
    assert client.exec(sid, ["true"]).status == 404


@pytest.mark.parametrize("q,status", [("true", 204), ("false", 204), ("bogus", 422)])
def test_delete_snapshot_query(client, q, status):
    sid = client.launch()
    r = client.shim.request("DELETE", f"/sandboxes/{sid}?delete_snapshot={q}")
    assert r.status == status, r
    if status == 422:
        assert_validation_error(r, ["query", "delete_snapshot"])


# ---- extensions -------------------------------------------------------------------------------

def test_snapshot_and_connect(client, shim):
    sid = client.launch()
    client.sh(sid, "echo kept > /tmp/kept")
    r = shim.request("POST", f"/sandboxes/{sid}/snapshot")
    assert r.status == 200, r
    snap = r.json()
    assert set(snap) == {"sandbox_id", "object", "size", "sha256", "store"}, snap
    assert snap["sandbox_id"] == sid and isinstance(snap["object"], str) and snap["object"]
    assert isinstance(snap["size"], int) and snap["size"] > 0
    assert len(snap["sha256"]) == 64 and int(snap["sha256"], 16) >= 0
    assert isinstance(snap["store"], str) and snap["store"]

    r = shim.request("POST", f"/sandboxes/{sid}/connect")
    assert r.status == 200 and r.json() == {"sandbox_id": sid, "outcome": "live"}, r
    assert client.delete(sid).status == 204
    r = shim.request("POST", f"/sandboxes/{sid}/connect")
    client.created.add(sid)
    assert r.status == 200 and r.json() == {"sandbox_id": sid, "outcome": "restored"}, r
    assert client.sh(sid, "cat /tmp/kept") == "kept\n"

    fresh = new_id("fresh")
    r = shim.request("POST", f"/sandboxes/{fresh}/connect?allow_egress=false")
    client.created.add(fresh)
    assert r.status == 200 and r.json() == {"sandbox_id": fresh, "outcome": "created"}, r
    r = shim.request("POST", f"/sandboxes/{fresh}/connect?allow_egress=perhaps")
    assert_validation_error(r, ["query", "allow_egress"])


def test_snapshot_unknown_sandbox_is_404(shim):
    r = shim.request("POST", f"/sandboxes/{new_id('ghost')}/snapshot")
    assert r.status == 404, r


def test_list(client, shim):
    sid = client.launch()
    r = shim.request("GET", "/sandboxes")
    assert r.status == 200, r
    body = r.json()
    assert set(body) == {"sandboxes"} and isinstance(body["sandboxes"], list)
    mine = [s for s in body["sandboxes"] if s.get("sandbox_id") == sid]
    assert len(mine) == 1, body
    assert mine[0]["allow_egress"] is False


def test_get_one_sandbox_is_its_list_entry_and_unknown_is_404(client, shim):
    sid = client.launch()
    r = shim.request("GET", f"/sandboxes/{sid}")
    assert r.status == 200, r
    listed = [s for s in shim.request("GET", "/sandboxes").json()["sandboxes"] if s["sandbox_id"] == sid]
    assert len(listed) == 1
    one = r.json()
    # The same object, but for what moves between the two calls.
    assert set(one) == set(listed[0]), (one, listed[0])
    for k in ("sandbox_id", "created_at_ms", "allow_egress", "disk_limit_bytes"):
        assert one[k] == listed[0][k], (k, one, listed[0])
    r = shim.request("GET", f"/sandboxes/{new_id('ghost')}")
    assert r.status == 404 and isinstance(r.json()["detail"], str), r
    r = shim.request("GET", "/sandboxes/--evil")
    assert r.status == 422, r


# ---- output cap --------------------------------------------------------------------------------

def test_exec_output_cap(shims, gateway):
    s = shims.shim(gateway, env={"SHIM_MAX_EXEC_OUTPUT": "1024"})
    c = ShimClient(s)
    try:
        sid = c.launch()
        body = c.run(sid, ["head", "-c", "5000", "/dev/zero"])
        assert body["exit_code"] == 0, body
        assert unb64(body["stdout_b64"]) == b"\0" * 1024
        assert body.get("truncated") is True, body
        # stderr is capped on its own.
        body = c.run(sid, ["sh", "-c", "head -c 3000 /dev/zero >&2; echo small"])
        assert unb64(body["stderr_b64"]) == b"\0" * 1024 and body["stdout"] == "small\n"
        assert body.get("truncated") is True, body
        # Exactly at the cap: not truncated.
        body = c.run(sid, ["head", "-c", "1024", "/dev/zero"])
        assert len(unb64(body["stdout_b64"])) == 1024
        assert "truncated" not in body, body
        body = c.run(sid, ["echo", "small"])
        assert body["stdout"] == "small\n" and "truncated" not in body, body
    finally:
        c.cleanup()


# ---- gateway unreachable ------------------------------------------------------------------------

def _unreachable_problem(what, r):
    """None when `r` is the contract's 502 for an unreachable gateway."""
    try:
        detail = r.json().get("detail")
    except ValueError:
        detail = None
    if r.status != 502 or not isinstance(detail, str) or "unreachable" not in detail.lower():
        return f"{what}: {r!r}"
    return None


def test_gateway_unreachable_is_502(shims):
    s = shims.shim(target=f"127.0.0.1:{free_port()}", secret="unreach")
    c = ShimClient(s)
    calls = [
        ("exec", lambda: c.exec("a", ["true"], timeout=5, http_timeout=90)),
        ("tar", lambda: s.request("GET", "/sandboxes/a/tar", timeout=90)),
        ("delete", lambda: s.request("DELETE", "/sandboxes/a", timeout=90)),
        ("list", lambda: s.request("GET", "/sandboxes", timeout=90)),
        ("restore", lambda: s.request("POST", "/sandboxes/a/restore", small_tar({"x": b"x"}),
                                      headers=TAR, timeout=90)),
        ("snapshot", lambda: s.request("POST", "/sandboxes/a/snapshot", timeout=90)),
        ("connect", lambda: s.request("POST", "/sandboxes/a/connect", timeout=90)),
        ("launch", lambda: s.request("POST", "/sandboxes", {"sandbox_id": "a"}, timeout=90)),
    ]
    problems = []
    for what, call in calls:
        r = call()
        if what == "exec":
            assert r.status != 200 and b"timed_out" not in r.body, r
        problems.append(_unreachable_problem(what, r))
    m = s.request("GET", "/metrics").body.decode()
    assert metric_value(m, "shim_gateway_errors_total") >= len(calls), m
    problems = [p for p in problems if p]
    assert not problems, "not a 502 saying unreachable:\n" + "\n".join(problems)


def test_gateway_stopped_is_502(shims):
    gw = shims.gateway(secret="stopme")
    s = shims.shim(gw)
    c = ShimClient(s)
    sid = c.launch()
    assert c.sh(sid, "echo up") == "up\n"
    gw.stop()
    r = c.exec(sid, ["sh", "-c", "echo hi"], timeout=5, http_timeout=90)
    assert r.status != 200 and b"timed_out" not in r.body, r
    problems = [_unreachable_problem("exec", r)]
    r = s.request("GET", "/health", auth=False)
    assert r.status == 200 and r.json()["cli_mounted"] is False, r
    r = s.request("POST", "/sandboxes", {"sandbox_id": new_id()}, timeout=90)
    problems.append(_unreachable_problem("launch", r))
    problems = [p for p in problems if p]
    assert not problems, "not a 502 saying unreachable:\n" + "\n".join(problems)


def test_gateway_rejects_shim_credentials_is_502(shims, gateway):
    """A gateway that refuses the shim's credentials serves nobody through
    it: calls are 502. /health keeps the seed's meaning (the gateway answers
    and its runtime works: cli_mounted true); /ready is what says the
    credentials are refused (tests/integration/test_shim_ready.py)."""
    s = shims.shim(gateway, env={"SHIM_GATEWAY_SECRET": "not-the-gateways"})
    r = s.request("GET", "/health", auth=False)
    assert r.status == 200 and r.json() == {"cli_mounted": True, "allow_egress": False}, r
    r = s.request("GET", "/ready", auth=False)
    assert r.status == 503, r
    r = s.request("POST", "/sandboxes", {"sandbox_id": new_id()})
    assert r.status == 502, r
    r = s.request("POST", f"/sandboxes/{new_id()}/exec", {"argv": ["true"]})
    assert r.status == 502, r


# ---- access log and metrics ----------------------------------------------------------------------

def test_access_log_and_metrics(client, shim):
    before = shim.request("GET", "/metrics").body.decode()
    sid = client.launch()
    client.run(sid, ["true"])
    assert client.shim.request("GET", f"/sandboxes/{new_id('ghost')}/tar").status == 404
    assert shim.request("GET", "/sandboxes", token="wrong").status == 401

    def find(route, status):
        return shim.logs.find(lambda r: r.get("message") == "request" and r.get("route") == route
                              and r.get("status") == status and r.get("sandbox_id") == sid)

    recs = wait_until(lambda: find("/sandboxes/{id}/exec", 200), timeout=5)
    assert recs, shim.logs.text()[-3000:]
    rec = recs[-1]
    assert rec["method"] == "POST" and isinstance(rec["duration_s"], (int, float))
    assert rec["duration_s"] >= 0
    assert find("/sandboxes", 201), shim.logs.text()[-3000:]
    assert wait_until(lambda: shim.logs.find(
        lambda r: r.get("message") == "request" and r.get("status") == 401
        and r.get("route") == "/sandboxes" and r.get("method") == "GET"), timeout=5)
    # The secret never appears in any log line.
    time.sleep(0.2)
    assert shim.secret not in shim.logs.text()
    assert shim.secret not in shim.stdout.text()

    after = shim.request("GET", "/metrics")
    assert after.status == 200 and after.headers["content-type"].startswith("text/plain")
    text = after.body.decode()
    for name, labels in [
        ("shim_requests_total", {"method": "POST", "route": "/sandboxes", "status": "201"}),
        ("shim_requests_total", {"method": "POST", "route": "/sandboxes/{id}/exec", "status": "200"}),
        ("shim_requests_total", {"method": "GET", "route": "/sandboxes/{id}/tar", "status": "404"}),
        ("shim_requests_total", {"method": "GET", "route": "/sandboxes", "status": "401"}),
        ("shim_exec_duration_seconds_count", None),
        ("shim_exec_duration_seconds_bucket", {"le": "+Inf"}),
    ]:
        assert metric_value(text, name, labels) >= metric_value(before, name, labels) + 1, (name, labels, text)
    assert metric_value(text, "shim_gateway_errors_total") >= metric_value(before, "shim_gateway_errors_total") + 1
    assert "# TYPE shim_bytes_streamed_total counter" in text
    assert "# TYPE shim_exec_duration_seconds histogram" in text
    assert shim.secret not in text


def test_debug_log_never_contains_secrets(shims, gateway):
    s = shims.shim(gateway, secret="client-side-secret-1234",
                   env={"SHIM_LOG_LEVEL": "debug", "SHIM_GATEWAY_SECRET": gateway.secret})
    c = ShimClient(s)
    try:
        sid = c.launch()
        c.run(sid, ["true"])
        assert s.request("GET", "/sandboxes", token="presented-wrong-token-5678").status == 401
        assert s.request("GET", f"/sandboxes/{sid}/tar").status == 200
    finally:
        c.cleanup()
    time.sleep(0.2)
    text = s.logs.text() + s.stdout.text()
    for secret in ("client-side-secret-1234", gateway.secret, "presented-wrong-token-5678"):
        assert secret not in text
    assert s.logs.find(lambda r: r.get("message") == "request" and r.get("sandbox_id") == sid)


def test_metrics_labels_come_from_fixed_sets_and_junk_cannot_crowd_out_real_series(client, shim):
    """A request line's method and path are the client's words: they never
    become label values, the text stays valid Prometheus, and a flood of
    junk cannot keep real routes from being counted."""
    from tests.lib.shim import raw_connect
    junk = ['X"}1 {x', "BREW", "M\\\\", "A" * 7]
    for i in range(200):
        s = raw_connect(shim)
        try:
            method = junk[i % len(junk)] if i % 2 else "GET"
            s.sendall(f"{method} /junk/{i}?q=\"{{}} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            while s.recv(65536):
                pass
        finally:
            s.close()
    sid = client.launch()
    client.run(sid, ["true"])
    text = shim.request("GET", "/metrics").body.decode()
    line = re.compile(r'^(# (HELP|TYPE) .*|[a-z_]+(\{([a-z_]+="[^"\\]*"(,[a-z_]+="[^"\\]*")*)?\})? [0-9.e+-]+)$')
    bad = [l for l in text.splitlines() if l and not line.match(l)]
    assert bad == [], bad[:5]
    methods = set(re.findall(r'method="([^"]*)"', text))
    assert methods <= {"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "other"}, methods
    assert not any("junk" in r for r in re.findall(r'route="([^"]*)"', text))
    assert re.search(r'shim_requests_total\{method="POST",route="/sandboxes/\{id\}/exec",status="200"\} [1-9]', text)
