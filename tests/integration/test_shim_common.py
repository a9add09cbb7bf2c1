"""Shared helpers of the sandbox-shim tests (test_shim_*.py).

This module holds no tests. The shim is driven the way an agent backend
drives it: plain HTTP/1.1 with the Python standard library (http.client and
raw sockets), never through gRPC. `Client` wraps one shim, remembers every
sandbox it creates and deletes them in `cleanup()`.
"""

from __future__ import annotations

import base64
import contextlib
import re
import secrets
from typing import Optional

from gateway_fixture import Shim, ShimResponse

# The contract's exact error bodies.
NOT_CONFIGURED = {"detail": "Gateway secret not configured"}
BAD_TOKEN = {"detail": "Invalid or missing bearer token"}
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def new_id(prefix: str = "shim") -> str:
    """A fresh, valid sandbox id."""
    return f"{prefix}-{secrets.token_hex(6)}"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(value: str) -> bytes:
    return base64.b64decode(value, validate=True)


def assert_validation_error(resp: ShimResponse, loc: Optional[list] = None) -> list:
    """A 422 with a FastAPI-shaped body: {"detail": [{"type", "loc", "msg"}, ...]}.
    With `loc`, one of the errors has exactly that location."""
    assert resp.status == 422, resp
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    body = resp.json()
    assert isinstance(body, dict) and set(body) == {"detail"}, body
    errors = body["detail"]
    assert isinstance(errors, list) and errors, body
    for e in errors:
        assert isinstance(e, dict), body
        assert isinstance(e.get("type"), str) and e["type"], body
        assert isinstance(e.get("loc"), list) and e["loc"], body
        assert all(isinstance(p, (str, int)) for p in e["loc"]), body
        assert isinstance(e.get("msg"), str) and e["msg"], body
    if loc is not None:
        assert any(e["loc"] == loc for e in errors), f"no error at {loc}: {body}"
    return errors


class Client:
    """The REST contract, as an agent backend uses it."""

    def __init__(self, shim: Shim):
        self.shim = shim
        self.created: set[str] = set()

    def launch(self, sandbox_id: Optional[str] = None, allow_egress: bool = False) -> str:
        sandbox_id = sandbox_id or new_id()
        r = self.shim.request("POST", "/sandboxes", {"sandbox_id": sandbox_id, "allow_egress": allow_egress})
        assert r.status == 201, r
        assert r.json() == {"sandbox_id": sandbox_id}, r
        self.created.add(sandbox_id)
        return sandbox_id

    def exec(self, sandbox_id: str, argv: list[str], timeout: Optional[int] = None,
             http_timeout: float = 120.0) -> ShimResponse:
        body: dict = {"argv": argv}
        if timeout is not None:
            body["timeout"] = timeout
        return self.shim.request("POST", f"/sandboxes/{sandbox_id}/exec", body, timeout=http_timeout)

    def run(self, sandbox_id: str, argv: list[str], timeout: Optional[int] = None) -> dict:
        """An exec that must answer 200; returns the body with "stdout" and
        "stderr" decoded (text)."""
        r = self.exec(sandbox_id, argv, timeout)
        assert r.status == 200, r
        body = r.json()
        body["stdout"] = unb64(body["stdout_b64"]).decode(errors="replace")
        body["stderr"] = unb64(body["stderr_b64"]).decode(errors="replace")
        return body

    def sh(self, sandbox_id: str, script: str) -> str:
        """Runs `sh -c script`; it must exit 0. Returns stdout."""
        body = self.run(sandbox_id, ["sh", "-c", script], timeout=60)
        assert body["exit_code"] == 0, body
        return body["stdout"]

    def delete(self, sandbox_id: str) -> ShimResponse:
        r = self.shim.request("DELETE", f"/sandboxes/{sandbox_id}")
        if r.status in (204, 404):
            self.created.discard(sandbox_id)
        return r

    def cleanup(self) -> None:
        for sid in list(self.created):
            with contextlib.suppress(Exception):
                self.delete(sid)
        self.created.clear()


def metric_value(text: str, name: str, labels: Optional[dict] = None) -> float:
    """The value of one sample of Prometheus text (0 when absent). With
    `labels`, the sample must carry exactly those labels."""
    total = 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        # Label values may contain braces (route="/sandboxes/{id}").
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$", line)
        if m is None or m.group(1) != name:
            continue
        got = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if labels is not None and got != labels:
            continue
        total += float(m.group(3))
    return total
