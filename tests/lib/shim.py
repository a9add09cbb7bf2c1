"""sandbox-shim: starting it, and talking to it the way an agent backend
does: plain HTTP/1.1 with the Python standard library (http.client and raw
sockets), never through gRPC.

The shim cannot listen on port 0: `start_shim()` picks a free port and
retries on a bind failure. Variables of the parent environment that
configure the shim (SHIM_*, PORT) never leak into it.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from tests.lib.client import new_id
from tests.lib.procs import (DEFAULT_GRACE_S, EXIT_MARGIN_S, START_TIMEOUT_S, ManagedProcess,
                             ProcessStartError, Repeater, base_env, free_port, overlay_env,
                             require_shim_binary, stop_checked)

_SHIM_PREFIXES = ("SHIM_",)
_SHIM_VARS = ("PORT",)
# Marks "use the gateway's secret" in start_shim() (None means: unset).
FROM_GATEWAY = object()

# The contract's exact error bodies.
NOT_CONFIGURED = {"detail": "Gateway secret not configured"}
BAD_TOKEN = {"detail": "Invalid or missing bearer token"}
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


# --- the process -------------------------------------------------------------

class ShimResponse:
    """One HTTP answer: status, headers (lower-case names) and the body."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes):
        self.status = status
        self.header_list = headers
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<HTTP {self.status} {self.body[:500]!r}>"


class Shim(ManagedProcess):
    """A running sandbox-shim on 127.0.0.1:`port`, with a tiny stdlib HTTP
    client (`request`) that sends the configured bearer token."""

    def __init__(self, env: Mapping[str, str], binary: Optional[Path] = None,
                 name: str = "sandbox-shim"):
        binary = binary or require_shim_binary()
        super().__init__([str(binary)], env, name=name, stop_timeout=DEFAULT_GRACE_S + EXIT_MARGIN_S)
        self.host = env.get("SHIM_HOST", "127.0.0.1")
        self.port = int(env["PORT"])
        self.secret = env.get("CLOUD_RUN_SANDBOX_GATEWAY_SECRET")
        self.listening_record: Optional[dict] = None

    def wait_listening(self, timeout: float = START_TIMEOUT_S) -> Optional[dict]:
        """The "listening" record, or None when the shim exited first (e.g.
        the port was taken) or did not report within `timeout`."""
        rec = self.logs.wait_for(lambda r: r.get("message") == "listening", timeout, alive=self.alive)
        self.listening_record = rec
        return rec

    def connection(self, timeout: float = 60.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def auth_headers(self, token: Optional[str] = None) -> dict:
        token = self.secret if token is None else token
        return {"Authorization": f"Bearer {token}"} if token is not None else {}

    def request(self, method: str, path: str, body: Any = None, *,
                headers: Optional[Mapping[str, str]] = None, auth: bool = True,
                token: Optional[str] = None, timeout: float = 60.0) -> ShimResponse:
        """Sends one request on a fresh connection. A dict/list body is sent
        as JSON (Content-Type application/json unless `headers` says
        otherwise); str/bytes as is."""
        hdrs = dict(self.auth_headers(token)) if auth else {}
        hdrs.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            if not any(k.lower() == "content-type" for k in hdrs):
                hdrs["Content-Type"] = "application/json"
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return ShimResponse(resp.status, resp.getheaders(), resp.read())
        finally:
            conn.close()


def shim_env(target: str, port: int, secret: Optional[str],
             env: Optional[Mapping[str, Optional[str]]] = None) -> dict:
    """Environment for a shim on 127.0.0.1:`port` in front of `target`:
    `secret` (None: unset) as CLOUD_RUN_SANDBOX_GATEWAY_SECRET, then `env`
    on top (None removes)."""
    out = {k: v for k, v in base_env().items()
           if not k.startswith(_SHIM_PREFIXES) and k not in _SHIM_VARS}
    out.update({"SHIM_HOST": "127.0.0.1", "PORT": str(port), "SHIM_GATEWAY_TARGET": target})
    if secret is not None:
        out["CLOUD_RUN_SANDBOX_GATEWAY_SECRET"] = secret
    return overlay_env(out, env)


def start_shim(gateway=None, *, target: Optional[str] = None,
               secret: Any = FROM_GATEWAY, env: Optional[Mapping[str, Optional[str]]] = None,
               attempts: int = 5, timeout: float = START_TIMEOUT_S) -> Shim:
    """Starts a shim in front of `gateway` (a running Gateway) or `target`
    (e.g. a closed port) and returns once it listens. `secret` defaults to
    the gateway's; None leaves it unset. The caller must stop() it (or use
    `running_shim`)."""
    if target is None:
        if gateway is None:
            raise ValueError("start_shim needs a gateway or a target")
        target = gateway.target
    if secret is FROM_GATEWAY:
        secret = gateway.secret if gateway is not None else None
    last = ""
    for _ in range(attempts):
        shim = Shim(shim_env(target, free_port(), secret, env))
        if shim.wait_listening(timeout) is not None:
            return shim
        last = shim.describe()
        shim.stop(timeout=5.0)
        if "cannot listen" not in last:
            break  # not a port race: do not hide the real failure
    raise ProcessStartError(f"sandbox-shim did not start\n{last}")


@contextlib.contextmanager
def running_shim(gateway=None, *, check: bool = False, **kw) -> Iterator[Shim]:
    """A shim (`start_shim(gateway, **kw)`) for the `with` block, stopped at
    its end; with `check`, by `stop_checked`."""
    shim = start_shim(gateway, **kw)
    try:
        yield shim
    finally:
        if check:
            stop_checked(shim)
        else:
            shim.stop()


# --- the REST contract ---------------------------------------------------------

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


class ShimClient:
    """The REST contract, as an agent backend uses it. Remembers every
    sandbox it creates; `cleanup()` deletes them."""

    def __init__(self, shim: Shim):
        self.shim = shim
        self.created: set[str] = set()

    def launch(self, sandbox_id: Optional[str] = None, allow_egress: bool = False) -> str:
        sandbox_id = sandbox_id or new_id("shim")
        r = self.shim.request("POST", "/sandboxes", {"sandbox_id": sandbox_id, "allow_egress": allow_egress})
        assert r.status == 201, r
        # A gateway that forbids egress says so (additive to the contract).
        assert r.json() in ({"sandbox_id": sandbox_id}, {"sandbox_id": sandbox_id, "allow_egress": False}), r
        assert "allow_egress" not in r.json() or allow_egress, r
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


# --- raw HTTP --------------------------------------------------------------------

def raw_connect(shim: Shim, timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection((shim.host, shim.port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response_head(sock: socket.socket, timeout: float) -> Optional[bytes]:
    """Bytes the server sent until the end of the response head (or until it
    closed / `timeout`). b"" when it closed without a byte; None on timeout
    without any byte."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while b"\r\n\r\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return data or None
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return data or None
        except (ConnectionResetError, BrokenPipeError):
            return data
        if not chunk:
            return data
        data += chunk
    return data


def status_of(head: Optional[bytes]) -> Optional[int]:
    if not head:
        return None
    try:
        return int(head.split(b"\r\n", 1)[0].split()[1])
    except (IndexError, ValueError):
        return None


def peer_closed(sock: socket.socket, timeout: float) -> bool:
    """True when the server closed the connection (EOF or reset) within
    `timeout`; any bytes it sends meanwhile (a 408) are read and dropped."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError, OSError):
            return True
        if not chunk:
            return True


def health_ok(shim: Shim, timeout: float = 10.0) -> bool:
    """A well-behaved client gets 200 on /health within `timeout`."""
    try:
        r = shim.request("GET", "/health", auth=False, timeout=timeout)
    except OSError:
        return False
    return r.status == 200


class HealthProbe(Repeater):
    """A normal client polling /health during an abuse (a `with` block);
    every probe must answer 200. `failures` lists what went wrong."""

    def __init__(self, shim: Shim, interval: float = 0.5, timeout: float = 10.0):
        super().__init__(interval, join_timeout=timeout + 5)
        self.shim = shim
        self.timeout = timeout
        self.ok = 0
        self.failures: list[str] = []

    def step(self) -> None:
        try:
            r = self.shim.request("GET", "/health", auth=False, timeout=self.timeout)
            if r.status == 200:
                self.ok += 1
            else:
                self.failures.append(f"HTTP {r.status} {r.body[:200]!r}")
        except OSError as e:
            self.failures.append(f"{type(e).__name__}: {e}")
