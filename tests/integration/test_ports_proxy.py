"""sandbox-shim's port proxy (/sandboxes/{id}/ports/{port}/…), its port
list and preview links (/p/<token>/…), against a real HTTP server (and a
WebSocket server) running in a sandbox without egress."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import socket
import struct
import subprocess
import time

import pytest

from tests.lib.client import new_id
from tests.lib.procs import RssSampler
from tests.lib.ports import Forward, start_detached, wait_listening
from tests.lib.shim import ShimClient, ShimResponse, health_ok, raw_connect, read_response_head, status_of

HTTP_PORT = 8000
WS_PORT = 8001
WS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ws")

# An HTTP/1.1 server for the sandbox: /echo answers with what it got,
# /chunked in chunks, /sse three events a second apart; /hold/NAME an event
# stream held open (one event now) until /release/NAME or 60 s; /tick/N/MS
# N events MS ms apart; /stall/S one event, then S seconds of silence;
# /late/S its answer after S seconds of silence; /bighead/KIB/N N events
# 0.5 s apart after a KIB KiB header; /hop an answer with hop-by-hop
# headers; /status/N an empty answer with status N; /interim/N N interim
# (100) answers before its own.
SERVER = r"""
import hashlib, json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
HELD, HELD_MU = {}, threading.Lock()
def held(name):
    with HELD_MU:
        return HELD.setdefault(name, threading.Event())
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def echo(self):
        n = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline(); break
                body += self.rfile.read(size); self.rfile.readline()
        else:
            body = self.rfile.read(n)
        out = json.dumps({"method": self.command, "path": self.path, "headers": dict(self.headers),
                          "body": body.decode("latin-1"), "len": len(body), "tag": sys.argv[2]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Upstream", "yes")
        self.end_headers()
        self.wfile.write(out)
    def events(self, parts, gap, extra=()):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        for i, part in enumerate(parts):
            if i:
                time.sleep(gap)
            self.wfile.write(b"data: %s\n\n" % part)
            self.wfile.flush()
        self.close_connection = True
    def do_GET(self):
        if self.path.startswith("/hold/"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"data: held\n\n")
            self.wfile.flush()
            held(self.path[6:]).wait(60)
            self.wfile.write(b"data: released\n\n")
            self.close_connection = True
        elif self.path.startswith("/release/"):
            held(self.path[9:]).set()
            self.echo()
        elif self.path.startswith("/tick/"):
            n, ms = map(int, self.path[6:].split("/"))
            self.events([b"tick %d" % i for i in range(n)], ms / 1000)
        elif self.path.startswith("/stall/"):
            self.events([b"start", b"end"], int(self.path[7:]))
        elif self.path.startswith("/bighead/"):
            kib, n = map(int, self.path[9:].split("/"))
            self.events([b"tick %d" % i for i in range(n)], 0.5, [("X-Big", "h" * (kib * 1024))])
        elif self.path.startswith("/late/"):
            time.sleep(int(self.path[6:]))
            self.echo()
        elif self.path.startswith("/malformed/"):
            self.wfile.write(MALFORMED[self.path[11:]])
            self.wfile.flush()
            self.close_connection = True
        elif self.path.startswith("/status/"):
            self.send_response(int(self.path[8:]))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith("/interim/"):
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n" * int(self.path[9:]))
            self.echo()
        elif self.path == "/hop":
            self.send_response(200)
            for k, v in (("Connection", "close, X-Resp-Hop, x-resp-hop-2"), ("X-Resp-Hop", "1"),
                         ("X-Resp-Hop-2", "1"), ("Keep-Alive", "timeout=5"), ("Proxy-Connection", "keep-alive"),
                         ("Proxy-Authenticate", "Basic realm=x"), ("Trailer", "X-Sum"), ("Upgrade", "h2c"),
                         ("TE", "trailers"), ("X-Kept", "yes"), ("Content-Length", "2")):
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(b"ok")
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(5):
                part = ("part %d;" % i).encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.startswith("/big/"):
            # N MiB, each 64 KiB block distinct: a block lost, doubled or
            # out of place changes the digest.
            n = int(self.path[5:]) * 16
            self.send_response(200)
            self.send_header("Content-Length", str(n * 65536))
            self.end_headers()
            for i in range(n):
                self.wfile.write(hashlib.sha256(b"%d" % i).digest() * 2048)
        elif self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            for i in range(3):
                self.wfile.write(b"data: event %d\n\n" % i)
                self.wfile.flush()
                time.sleep(1)
            self.close_connection = True
        else:
            self.echo()
    do_POST = do_PUT = do_DELETE = do_PATCH = echo
MALFORMED = {
    "cl-te": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bare-lf": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    "obs-fold": b"HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\nContent-Length: 2\r\n\r\nok",
    "two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!",
    "same-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
    "bad-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n-1\r\n\r\n",
}
ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def web(sbx):
    sid = new_id("proxy")
    sbx.launch(sid)
    start_detached(sbx, sid, ["python3", "-c", SERVER, str(HTTP_PORT), sid])
    wait_listening(sbx, sid, HTTP_PORT)
    return sid


def _path(sid, rest="/", port=HTTP_PORT):
    return f"/sandboxes/{sid}/ports/{port}{rest}"


def test_get_passes_path_query_and_headers_and_sets_forwarded(shim, web):
    r = shim.request("GET", _path(web, "/echo/a%20b?x=1&y=%2F"), headers={"X-Custom": "v"})
    assert r.status == 200, r
    assert r.headers["x-upstream"] == "yes"
    got = r.json()
    assert got["method"] == "GET" and got["path"] == "/echo/a%20b?x=1&y=%2F" and got["tag"] == web
    h = {k.lower(): v for k, v in got["headers"].items()}
    assert h["x-custom"] == "v"
    assert "authorization" not in h  # our bearer stays with the shim
    assert h["x-forwarded-prefix"] == f"/sandboxes/{web}/ports/{HTTP_PORT}"
    assert h["x-forwarded-proto"] == "http" and h["x-forwarded-for"] == "127.0.0.1"
    assert h["x-forwarded-host"].startswith("127.0.0.1:")


@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_bodies_go_up(shim, web, method):
    body = os.urandom(3 * 1024 * 1024).hex()[:5_000_000]
    r = shim.request(method, _path(web, "/echo"), body=body.encode(),
                     headers={"Content-Type": "text/plain"})
    assert r.status == 200, r
    got = r.json()
    assert got["method"] == method and got["len"] == len(body) and got["body"] == body


def test_a_chunked_request_body_goes_up_chunked(shim, web):
    conn = shim.connection()
    conn.putrequest("POST", _path(web, "/echo"))
    for k, v in shim.auth_headers().items():
        conn.putheader(k, v)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in (b"hello ", b"chunked ", b"world"):
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    r = conn.getresponse()
    assert r.status == 200
    assert json.loads(r.read())["body"] == "hello chunked world"


def test_chunked_response_arrives_whole(shim, web):
    r = shim.request("GET", _path(web, "/chunked"))
    assert r.status == 200, r
    assert r.body == b"".join(b"part %d;" % i for i in range(5))


def _big_digest(mib):
    h = hashlib.sha256()
    for i in range(mib * 16):
        h.update(hashlib.sha256(b"%d" % i).digest() * 2048)
    return h.hexdigest()


def test_a_large_answer_arrives_intact(shim, web):
    r = shim.request("GET", _path(web, "/big/96"))
    assert r.status == 200, r
    assert len(r.body) == 96 * 1024 * 1024
    assert hashlib.sha256(r.body).hexdigest() == _big_digest(96)


def test_a_slow_reader_holds_the_answer_back_with_flat_memory(shim, web, gateway):
    """Flow control all the way: a client that reads 256 MiB slowly makes
    the server in the sandbox wait, while the shim and the gateway hold no
    more than a few MiB of it each."""
    mib = 256
    conn = shim.connection()
    conn.request("GET", _path(web, f"/big/{mib}"), headers=shim.auth_headers())
    r = conn.getresponse()
    assert r.status == 200
    h, got = hashlib.sha256(), 0
    with RssSampler(shim) as in_shim, RssSampler(gateway) as in_gateway:
        while True:
            piece = r.read(1024 * 1024)
            if not piece:
                break
            h.update(piece)
            got += len(piece)
            if got % (32 * 1024 * 1024) == 0:
                time.sleep(0.3)  # the socket fills; everything behind it must wait
    conn.close()
    assert got == mib * 1024 * 1024
    assert h.hexdigest() == _big_digest(mib)
    assert in_shim.growth_mib < 48, f"the shim grew by {in_shim.growth_mib:.0f} MiB"
    assert in_gateway.growth_mib < 48, f"the gateway grew by {in_gateway.growth_mib:.0f} MiB"


def test_sse_arrives_as_it_is_sent(shim, web):
    conn = shim.connection(timeout=30)
    conn.request("GET", _path(web, "/sse"), headers=shim.auth_headers())
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-type") == "text/event-stream"
    t0 = time.monotonic()
    first = r.readline()
    assert first == b"data: event 0\n"
    assert time.monotonic() - t0 < 0.8  # not held back until the stream ends
    rest = r.read()
    assert b"data: event 2" in rest
    conn.close()


def test_nothing_listening_is_502_and_unknown_sandbox_404(shim, web):
    r = shim.request("GET", _path(web, "/", port=9))
    assert r.status == 502 and "Nothing listens on port 9" in r.json()["detail"], r
    r = shim.request("GET", _path("no-such-proxy-box", "/"))
    assert r.status == 404, r
    r = shim.request("GET", _path(web, "/", port=70000))
    assert r.status == 422, r


def test_port_root_redirects_to_the_slash(shim, web):
    r = shim.request("GET", _path(web, ""))
    assert r.status == 308 and r.headers["location"] == _path(web, "/"), r


def test_ports_list(shim, web):
    r = shim.request("GET", f"/sandboxes/{web}/ports")
    assert r.status == 200, r
    ports = r.json()["ports"]
    mine = [p for p in ports if p["port"] == HTTP_PORT]
    assert mine and mine[0]["address"] == "0.0.0.0" and mine[0]["loopback_only"] is False
    assert isinstance(mine[0]["pid"], int) and mine[0]["pid"] > 0


# ---- preview links ------------------------------------------------------------------


def _link(shim, sid, port=HTTP_PORT, ttl=3600):
    r = shim.request("POST", f"/sandboxes/{sid}/ports/{port}/links", body={"ttl_seconds": ttl})
    assert r.status == 201, r
    return r.json()


def test_link_works_without_bearer(shim, web):
    link = _link(shim, web)
    assert link["url"].endswith(link["path"]) and link["path"].startswith("/p/")
    assert link["expires_at"] > time.time() + 3500
    r = shim.request("GET", link["path"] + "echo?q=1", auth=False)
    assert r.status == 200, r
    got = r.json()
    assert got["path"] == "/echo?q=1" and got["tag"] == web
    h = {k.lower(): v for k, v in got["headers"].items()}
    assert h["x-forwarded-prefix"] == link["path"].rstrip("/")


def test_expired_link_is_403(shim, web):
    link = _link(shim, web, ttl=1)
    time.sleep(2.1)
    assert shim.request("GET", link["path"], auth=False).status == 403


def test_tampered_link_is_403(shim, web):
    path = _link(shim, web)["path"]
    token = path.split("/")[2]
    sid, port, exp, created, mac = token.split(".")
    for bad in (f"{sid}.{port}.{int(exp) + 1000}.{created}.{mac}",
                f"{sid}.{port}.{exp}.{int(created) + 1}.{mac}",
                f"{sid}.{port}.{exp}.{created}.{mac[:-1]}{'B' if mac[-1] == 'A' else 'A'}",
                f"{sid}.{port}.{exp}.{mac}", f"{sid}.{port}.{exp}.{created}", "garbage",
                f"{sid}.{port}.{exp}.{created}.{mac}.x", f"{sid}.{port}.{exp}.-{created}.{mac}"):
        r = shim.request("GET", f"/p/{bad}/", auth=False)
        assert r.status == 403, (bad, r)


def test_link_for_another_port_is_403(shim, web):
    token = _link(shim, web)["path"].split("/")[2]
    sid, port, exp, created, mac = token.split(".")
    r = shim.request("GET", f"/p/{sid}.{WS_PORT}.{exp}.{created}.{mac}/", auth=False)
    assert r.status == 403, r


def test_link_after_delete_and_recreate_is_403(shim, sbx):
    sid = new_id("proxy-again")
    sbx.launch(sid)
    start_detached(sbx, sid, ["python3", "-c", SERVER, str(HTTP_PORT), sid])
    wait_listening(sbx, sid, HTTP_PORT)
    path = _link(shim, sid)["path"]
    assert shim.request("GET", path + "echo", auth=False).status == 200
    sbx.delete(sid)
    assert shim.request("GET", path + "echo", auth=False).status == 403
    sbx.launch(sid)
    start_detached(sbx, sid, ["python3", "-c", SERVER, str(HTTP_PORT), sid])
    wait_listening(sbx, sid, HTTP_PORT)
    assert shim.request("GET", path + "echo", auth=False).status == 403
    assert shim.request("GET", _link(shim, sid)["path"] + "echo", auth=False).status == 200


def test_link_gives_no_access_to_the_api(shim, web):
    path = _link(shim, web)["path"]
    # The token is not a bearer.
    token = path.split("/")[2]
    r = shim.request("GET", "/sandboxes", headers={"Authorization": f"Bearer {token}"}, auth=False)
    assert r.status == 401


# ---- isolation ------------------------------------------------------------------------


def test_two_sandboxes_on_the_same_port_answer_each_for_itself(shim, sbx, web):
    other = new_id("proxy-other")
    sbx.launch(other)
    start_detached(sbx, other, ["python3", "-c", SERVER, str(HTTP_PORT), other])
    wait_listening(sbx, other, HTTP_PORT)
    assert shim.request("GET", _path(web, "/echo")).json()["tag"] == web
    assert shim.request("GET", _path(other, "/echo")).json()["tag"] == other


# ---- WebSocket -------------------------------------------------------------------------

WS_SERVER = r"""
const { WebSocketServer } = require('ws');
const wss = new WebSocketServer({ port: +process.argv[1], host: '127.0.0.1' });
wss.on('connection', (ws, req) => {
  ws.send('hello ' + req.url);
  ws.on('message', (m, binary) => ws.send(binary ? m : 'echo: ' + m));
});
"""

WS_CLIENT = r"""
const WebSocket = require('ws');
const [url, auth] = [process.argv[1], process.argv[2]];
const ws = new WebSocket(url, { headers: auth ? { Authorization: auth } : {} });
const got = [];
ws.on('message', (m, binary) => {
  got.push(binary ? 'bin:' + m.length : m.toString());
  if (got.length === 1) { ws.send('ping'); ws.send(Buffer.alloc(200000, 7)); }
  if (got.length === 3) { console.log(JSON.stringify(got)); ws.close(); }
});
ws.on('unexpected-response', (req, res) => { console.log(JSON.stringify({ status: res.statusCode })); process.exit(1); });
ws.on('close', (code) => { if (got.length < 3) console.log(JSON.stringify({ closed: code, got })); });
ws.on('error', (e) => { console.log(JSON.stringify({ error: String(e) })); process.exit(1); });
"""


@pytest.fixture(scope="module")
def node_ws():
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node or npm is not installed")
    if not os.path.isdir(os.path.join(WS_DIR, "node_modules", "ws")):
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=WS_DIR, capture_output=True, text=True,
                           timeout=600, check=False)
        assert r.returncode == 0, r.stderr[-800:]
    return node


def _ws_client(node, url, auth=None):
    r = subprocess.run([node, "-e", WS_CLIENT, url, auth or ""], cwd=WS_DIR, capture_output=True, text=True,
                       timeout=60, env={**os.environ, "NODE_PATH": os.path.join(WS_DIR, "node_modules")})
    lines = r.stdout.strip().splitlines()
    assert lines, (r.returncode, r.stderr[-2000:])
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def ws_box(sbx, node_ws):
    sid = new_id("proxy-ws")
    sbx.launch(sid)
    start_detached(sbx, sid, ["env", "NODE_PATH=" + os.path.join(WS_DIR, "node_modules"), node_ws, "-e",
                              WS_SERVER, str(WS_PORT)])
    wait_listening(sbx, sid, WS_PORT)
    return sid


def test_websocket_echo_through_the_proxy(shim, node_ws, ws_box):
    url = f"ws://{shim.host}:{shim.port}{_path(ws_box, '/chat?room=1', port=WS_PORT)}"
    got = _ws_client(node_ws, url, f"Bearer {shim.secret}")
    assert got == ["hello /chat?room=1", "echo: ping", "bin:200000"], got


def test_websocket_through_a_preview_link(shim, node_ws, ws_box):
    path = _link(shim, ws_box, port=WS_PORT)["path"]
    got = _ws_client(node_ws, f"ws://{shim.host}:{shim.port}{path}live")
    assert got == ["hello /live", "echo: ping", "bin:200000"], got


def test_slow_head_on_a_preview_link_is_cut(shim, web):
    s = socket.create_connection((shim.host, shim.port), timeout=30)
    s.sendall(b"GET /p/x/ HTTP/1.1\r\nHost: a\r\n")  # and never the rest
    t0 = time.monotonic()
    s.settimeout(30)
    try:
        data = s.recv(100)
    except OSError:
        data = b""
    assert time.monotonic() - t0 < 25
    assert data == b"" or b"408" in data or b"400" in data
    s.close()


# ---- limits ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def web2(sbx):
    """A second sandbox with the same server, for what one sandbox's load
    must leave alone."""
    sid = new_id("proxy-two")
    sbx.launch(sid)
    start_detached(sbx, sid, ["python3", "-c", SERVER, str(HTTP_PORT), sid])
    wait_listening(sbx, sid, HTTP_PORT)
    return sid


class Held:
    """A request through the shim whose answer stays open: sent on a raw
    socket, its head and first event read. `close()` leaves politely,
    `reset()` abruptly (an RST, mid-answer)."""

    def __init__(self, shim, path: str, auth: bool = True, first: bytes = b"data: held"):
        self.sock = raw_connect(shim, timeout=30)
        head = f"GET {path} HTTP/1.1\r\nHost: {shim.host}:{shim.port}\r\n"
        if auth:
            head += f"Authorization: Bearer {shim.secret}\r\n"
        self.sock.sendall(head.encode() + b"\r\n")
        self.data = b""
        while first not in self.data:
            piece = self.sock.recv(65536)
            assert piece, f"closed before {first!r}: {self.data!r}"
            self.data += piece
        assert status_of(self.data) == 200, self.data

    def rest(self, timeout: float = 30.0) -> tuple[bytes, bool]:
        """What comes after, up to the answer's end: (the bytes, True when
        the answer ended properly: the last chunk came). Raises
        socket.timeout when neither came within `timeout`."""
        self.sock.settimeout(timeout)
        while not self.data.endswith(b"0\r\n\r\n"):
            try:
                piece = self.sock.recv(65536)
            except ConnectionResetError:
                piece = b""
            if not piece:
                return self.data, False
            self.data += piece
        return self.data, True

    def reset(self) -> None:
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


def _release(sbx, sid: str, name: str) -> None:
    """Ends the answers held under `name` in `sid` by asking its server
    directly over Forward (not through the shim, whose slots are full)."""
    f = Forward(sbx, sid, HTTP_PORT, first=f"GET /release/{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), timeout=30)
    got = f.recv()
    f.cancel()
    assert got.startswith(b"HTTP/1.1 200"), got


def _status_soon(shim, path: str, want: int, timeout: float = 10.0) -> ShimResponse:
    """Asks `path` until it answers `want` (the slot of a client that left
    is given back once the shim has seen it go): the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        r = shim.request("GET", path, timeout=30)
        if r.status == want or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def test_forwards_into_one_sandbox_are_capped_and_given_back(shims, gateway, sbx, web, web2):
    """SHIM_MAX_FORWARDS_PER_SANDBOX=2: with two answers held open into one
    sandbox, a third request to it (by the API route or a preview link) is
    429 with a detail saying so, while another sandbox is still reached.
    The slots come back when the held answers end — one ended by the
    server, one by its client resetting the connection mid-answer — so
    the sandbox takes two at once again, and not three."""
    shim = shims.shim(gateway, env={"SHIM_MAX_FORWARDS_PER_SANDBOX": "2"})
    name = new_id("cap")
    held = [Held(shim, _path(web, f"/hold/{name}"))]
    try:
        held.append(Held(shim, _path(web, f"/hold/{name}-b")))
        a, b = held
        r = shim.request("GET", _path(web, "/echo"))
        assert r.status == 429, r
        assert r.json() == {"detail": "Too many forwarded connections into this sandbox"}, r
        link = _link(shim, web)["path"]
        r = shim.request("GET", link + "echo", auth=False)
        assert r.status == 429 and r.json() == {"detail": "Too many forwarded connections into this sandbox"}, r
        assert shim.request("GET", _path(web2, "/echo")).json()["tag"] == web2
        # One ends as its server finishes it, the other as its client vanishes.
        _release(sbx, web, name)
        rest, whole = a.rest()
        assert whole and b"data: released" in rest, rest
        b.reset()
    finally:
        _release(sbx, web, name)
        _release(sbx, web, f"{name}-b")
        for h in held:
            h.close()
    assert _status_soon(shim, _path(web, "/echo"), 200).status == 200
    again = [Held(shim, _path(web, f"/hold/{name}-c"))]
    try:
        again.append(Held(shim, link + f"hold/{name}-c", auth=False))
        assert shim.request("GET", _path(web, "/echo")).status == 429
    finally:
        _release(sbx, web, f"{name}-c")
        for h in again:
            h.close()


def test_forwards_in_all_are_capped(shims, gateway, sbx, web, web2):
    """SHIM_MAX_FORWARDS=3 across two sandboxes: two answers held in one
    and one in the other, a fourth request to either is 429; one of them
    ended, the next is served."""
    shim = shims.shim(gateway, env={"SHIM_MAX_FORWARDS": "3"})
    name = new_id("total")
    held = []
    try:
        for sid in (web, web, web2):
            held.append(Held(shim, _path(sid, f"/hold/{name}")))
        for sid in (web2, web):
            r = shim.request("GET", _path(sid, "/echo"))
            assert r.status == 429 and r.json() == {"detail": "Too many forwarded connections"}, r
        held.pop().close()  # the one in web2
        assert _status_soon(shim, _path(web2, "/echo"), 200).status == 200
    finally:
        for sid in (web, web2):
            _release(sbx, sid, name)
        for h in held:
            h.close()


def test_an_idle_answer_is_cut_and_its_slot_given_back(shims, gateway, web):
    """SHIM_FORWARD_IDLE_SECONDS=2: an answer whose server goes silent (one
    event, then 60 s of nothing) is cut long before the server would end
    it: the client sees the connection closed without the answer's end.
    With one slot per sandbox, the next request is served: the slot came
    back (before the client saw the cut)."""
    shim = shims.shim(gateway, env={"SHIM_FORWARD_IDLE_SECONDS": "2", "SHIM_MAX_FORWARDS_PER_SANDBOX": "1"})
    h = Held(shim, _path(web, "/stall/60"), first=b"data: start")
    try:
        rest, whole = h.rest(timeout=30)  # a socket.timeout here: never cut
        assert not whole and b"data: end" not in rest, rest
    finally:
        h.close()
    r = shim.request("GET", _path(web, "/echo"))
    assert r.status == 200, r


def test_a_server_silent_before_its_answer_is_cut(shims, gateway, web):
    """SHIM_FORWARD_IDLE_SECONDS=2: a server that sends nothing for 60 s
    after the request is cut: the client gets 504 well before the server
    would have answered, and the slot comes back."""
    shim = shims.shim(gateway, env={"SHIM_FORWARD_IDLE_SECONDS": "2", "SHIM_MAX_FORWARDS_PER_SANDBOX": "1"})
    r = shim.request("GET", _path(web, "/late/60"), timeout=30)
    assert r.status == 504 and "2 s" in r.json()["detail"], r
    r = shim.request("GET", _path(web, "/echo"))
    assert r.status == 200, r


def test_at_the_cap_a_client_may_go_on_as_soon_as_its_answer_ends(shims, gateway, web):
    """SHIM_MAX_FORWARDS_PER_SANDBOX=1: a request's slot is given back
    before the end of its answer reaches the client, so requests one after
    another — answers with a length, chunked, to the connection's end,
    without a body (HEAD, which that server does not implement: 501),
    refused by the proxy (431), nothing listening (502) — are each
    answered, never 429."""
    shim = shims.shim(gateway, env={"SHIM_MAX_FORWARDS_PER_SANDBOX": "1"})
    big = {"X-Big": "b" * (100 * 1024)}
    for i in range(10):
        for method, rest, headers, want in (("GET", "/echo", {}, 200), ("GET", "/chunked", {}, 200),
                                            ("GET", "/tick/1/0", {}, 200), ("HEAD", "/echo", {}, 501),
                                            ("GET", "/echo", big, 431)):
            r = shim.request(method, _path(web, rest), headers=headers)
            assert r.status == want, (i, method, rest, r)
        r = shim.request("GET", _path(web, "/", port=9))
        assert r.status == 502, (i, r)


def test_an_answer_that_keeps_moving_is_not_cut(shims, gateway, web):
    """SHIM_FORWARD_IDLE_SECONDS=2: an event stream that sends an event
    every 0.5 s for 5 s — longer than the idle time in all, never silent
    that long — arrives whole, to its proper end."""
    shim = shims.shim(gateway, env={"SHIM_FORWARD_IDLE_SECONDS": "2"})
    h = Held(shim, _path(web, "/tick/11/500"), first=b"data: tick 0")
    try:
        rest, whole = h.rest(timeout=30)
    finally:
        h.close()
    assert whole, rest
    assert all(b"data: tick %d\n" % i in rest for i in range(11)), rest


def test_a_request_head_too_large_is_431_and_the_shim_stays_well(shims, gateway, web):
    """The head forwarded upstream is capped at 64 KiB: a 48 KiB header
    goes through intact; a 200 KiB one is 431 with a detail, on the API
    route and on a preview link (it fits MHD's 256 KiB per connection, so
    it is the proxy's cap that answers); a 300 KiB one is refused by MHD
    itself (431, or the connection closed while it is still sent). The shim then answers
    /health and forwards as before, and no slot was kept (one per
    sandbox here)."""
    shim = shims.shim(gateway, env={"SHIM_MAX_FORWARDS_PER_SANDBOX": "1"})
    link = _link(shim, web)["path"]
    ok = "a" * (48 * 1024)
    r = shim.request("GET", _path(web, "/echo"), headers={"X-Big": ok})
    assert r.status == 200 and r.json()["headers"]["X-Big"] == ok, r
    big = {"X-Big": "b" * (200 * 1024)}
    for path, auth in ((_path(web, "/echo"), True), (link + "echo", False)):
        r = shim.request("GET", path, headers=big, auth=auth)
        assert r.status == 431 and r.json() == {"detail": "Request head too large to forward"}, r
    s = raw_connect(shim)
    try:
        s.sendall(f"GET {_path(web, '/echo')} HTTP/1.1\r\nHost: x\r\nX-Huge: {'c' * (300 * 1024)}\r\n\r\n".encode())
        got = read_response_head(s, 10)
    except (ConnectionResetError, BrokenPipeError):
        got = b""
    finally:
        s.close()
    assert got == b"" or status_of(got) == 431, got
    assert health_ok(shim)
    r = shim.request("GET", _path(web, "/echo"))
    assert r.status == 200 and r.json()["tag"] == web, r


def test_a_response_head_too_large_is_502_at_once(shim, web):
    """The response head taken from the server is capped at 64 KiB too: a
    head of 70 KiB, followed by a minute of events, gets the client a 502
    saying so once the cap is reached, not at the stream's end (the rest
    is not read); a 48 KiB head passes, its header intact."""
    r = shim.request("GET", _path(web, "/bighead/48/1"))
    assert r.status == 200 and r.headers["x-big"] == "h" * (48 * 1024) and r.body == b"data: tick 0\n\n", r
    r = shim.request("GET", _path(web, "/bighead/70/120"), timeout=30)
    assert r.status == 502 and r.json() == {"detail": "The server in the sandbox sent a response head over 64 KiB"}, r
    assert shim.request("GET", _path(web, "/echo")).status == 200


# ---- hop-by-hop headers ------------------------------------------------------------------


def _echoed_headers(shim, path: str, lines: list[tuple[str, str]], auth: bool = True) -> dict:
    """Sends a GET with exactly these header lines (repeated names kept) on
    a raw socket: the headers the server in the sandbox received, by
    lower-case name."""
    head = f"GET {path} HTTP/1.1\r\nHost: {shim.host}:{shim.port}\r\n"
    if auth:
        head += f"Authorization: Bearer {shim.secret}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in lines) + "Connection: close\r\n\r\n"
    s = raw_connect(shim, timeout=30)
    try:
        s.sendall(head.encode())
        data = b""
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            data += piece
    finally:
        s.close()
    assert status_of(data) == 200, data[:500]
    body = data.split(b"\r\n\r\n", 1)[1]
    return {k.lower(): v for k, v in json.loads(body)["headers"].items()}


HOP_LINES = [("Connection", "keep-alive, X-Secret-Hop"), ("Connection", " x-second-hop ,te"),
             ("X-Secret-Hop", "1"), ("X-Second-Hop", "1"), ("Keep-Alive", "timeout=5"),
             ("Proxy-Connection", "keep-alive"), ("TE", "trailers"), ("Trailer", "X-Sum"),
             ("Upgrade", "h2c"), ("Proxy-Authorization", "Basic c2VjcmV0"), ("X-Custom", "kept")]
HOP_NAMES = ("connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
             "proxy-authorization", "x-secret-hop", "x-second-hop")


def test_hop_by_hop_request_headers_stay_with_the_shim(shim, web):
    """RFC 9110 §7.6.1: the headers a request's Connection header names
    (in any of its Connection lines, any case, with spaces), and the
    standard hop-by-hop ones, do not reach the server in the sandbox; nor
    does our bearer, in any header; an upgrade that is not a WebSocket's
    is not passed on. Other headers are."""
    got = _echoed_headers(shim, _path(web, "/echo"), HOP_LINES)
    assert got["x-custom"] == "kept", got
    assert got["connection"] == "close", got  # the shim's own
    for name in HOP_NAMES[1:]:
        assert name not in got, (name, got)
    assert "authorization" not in got, got
    assert not any(shim.secret in v for v in got.values()), got


def test_hop_by_hop_request_headers_stay_with_the_shim_on_a_preview_link(shim, web):
    """The same on a preview link, where the visitor's own Authorization
    goes on to the server — unless Connection names it."""
    link = _link(shim, web)["path"]
    got = _echoed_headers(shim, link + "echo", HOP_LINES + [("Authorization", "Basic dmlzaXRvcg==")], auth=False)
    assert got["x-custom"] == "kept" and got["authorization"] == "Basic dmlzaXRvcg==", got
    for name in HOP_NAMES[1:]:
        assert name not in got, (name, got)
    got = _echoed_headers(shim, link + "echo", [("Authorization", "Basic dmlzaXRvcg=="), ("Connection", "Authorization")],
                          auth=False)
    assert "authorization" not in got, got


def test_a_connection_header_naming_too_many_is_refused(shim, web):
    """More than 32 names in a request's Connection headers is 400, not a
    request forwarded with some of them passed on."""
    names = [f"X-Opt-{i}" for i in range(33)]
    r = shim.request("GET", _path(web, "/echo"), headers={"Connection": ", ".join(names)})
    assert r.status == 400 and r.json() == {"detail": "Too many header names in Connection"}, r
    got = _echoed_headers(shim, _path(web, "/echo"), [("Connection", ", ".join(names[:31])), ("X-Opt-0", "1")])
    assert "x-opt-0" not in got, got


def test_hop_by_hop_response_headers_stay_with_the_shim(shim, web):
    """The answer's way back: the headers its Connection header names and
    the standard hop-by-hop ones (Keep-Alive, Proxy-Connection,
    Proxy-Authenticate, Trailer, Upgrade on an answer that is no switch,
    TE) do not reach the client; others do, and the body is intact."""
    r = shim.request("GET", _path(web, "/hop"))
    assert r.status == 200 and r.body == b"ok", r
    assert r.headers.get("x-kept") == "yes", r.headers
    for name in ("x-resp-hop", "x-resp-hop-2", "keep-alive", "proxy-connection", "proxy-authenticate", "trailer",
                 "upgrade", "te"):
        assert name not in r.headers, (name, r.header_list)
    assert all("x-resp-hop" not in v.lower() for k, v in r.header_list if k.lower() == "connection"), r.header_list


# ---- hostile link holders ----------------------------------------------------------------


def _stalled_visitor(shim, path: str) -> tuple[socket.socket, int]:
    """A preview link's visitor (no bearer) that reads the head of its
    answer and then stops reading (its receive buffer small): the socket
    and the status."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect((shim.host, shim.port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {shim.host}:{shim.port}\r\n\r\n".encode())
    head = read_response_head(s, 30.0)
    return s, status_of(head)


def test_link_visitors_who_stop_reading_leave_room_and_are_cut(shims, gateway, web, web2):
    """Eight visitors of a preview link ask for a large answer, read its
    first bytes and stop reading, with 8 forwarded connections allowed per
    sandbox and in all. Link traffic holds only part of either cap: the
    sandbox's owner (bearer) and another sandbox are still served while
    they stall; and a visitor that reads nothing for SHIM_FORWARD_IDLE_SECONDS
    is cut like a silent server, so its slot comes back long before the
    answer would have ended."""
    shim = shims.shim(gateway, env={"SHIM_FORWARD_IDLE_SECONDS": "2", "SHIM_MAX_FORWARDS_PER_SANDBOX": "8",
                                    "SHIM_MAX_FORWARDS": "8"})
    link = _link(shim, web)["path"]
    visitors = []
    try:
        for _ in range(8):
            visitors.append(_stalled_visitor(shim, link + "big/64"))
        statuses = sorted(st for _, st in visitors)
        assert set(statuses) <= {200, 429} and statuses.count(200) >= 1, statuses
        r = shim.request("GET", _path(web, "/echo"), timeout=30)
        assert r.status == 200, ("the owner is locked out by stalled link visitors", r)
        r = shim.request("GET", _path(web2, "/echo"), timeout=30)
        assert r.status == 200, ("another sandbox is locked out by stalled link visitors", r)
        # The stalled visitors are cut: a visitor of the link gets in again.
        deadline = time.monotonic() + 15.0
        while True:
            r = shim.request("GET", link + "echo", auth=False, timeout=30)
            if r.status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert r.status == 200, ("stalled visitors still hold their slots after 15 s", r)
    finally:
        for s, _ in visitors:
            s.close()


def _sandbox_ids(shim) -> list[str]:
    r = shim.request("GET", "/sandboxes")
    assert r.status == 200, r
    return [x["sandbox_id"] if isinstance(x, dict) else x for x in r.json()["sandboxes"]]


def test_forged_links_do_not_keep_a_sandbox_alive(shims):
    """SANDBOX_IDLE_TTL=3: forged links to a sandbox, twice a second for
    10 s, are each 403 — and the sandbox still ends at its idle timeout:
    a token is checked before the gateway is asked anything, so a visitor
    without a valid link never counts as use."""
    gw = shims.gateway(env={"SANDBOX_IDLE_TTL": "3"}, secret="forged-links-test-secret")
    shim = shims.shim(gw)
    sid = ShimClient(shim).launch(new_id("forged"))
    future = int(time.time()) + 3600
    forged = [f"/p/{sid}.{HTTP_PORT}.{future}.{'A' * 43}/",
              f"/p/{sid}.{HTTP_PORT}.{future}.{int(time.time() * 1000)}.{'A' * 43}/"]
    end = time.monotonic() + 10.0
    while time.monotonic() < end:
        for path in forged:
            r = shim.request("GET", path, auth=False, timeout=30)
            assert r.status == 403, r
        time.sleep(0.5)
    assert sid not in _sandbox_ids(shim), "forged links kept the sandbox alive past its idle timeout (3 s) for 10 s"


def test_a_forged_link_with_a_body_is_refused_before_the_body(shim, web):
    """A POST to a forged link declaring a 100 MB body, of which nothing is
    sent: 403 at once (the shim does not wait for, nor read, the body)."""
    s = raw_connect(shim, timeout=30)
    try:
        s.sendall(f"POST /p/{web}.{HTTP_PORT}.{int(time.time()) + 3600}.1.{'A' * 43}/echo HTTP/1.1\r\n"
                  f"Host: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000000\r\n\r\n".encode())
        head = read_response_head(s, 5.0)
    finally:
        s.close()
    assert status_of(head) == 403, head
    assert health_ok(shim)


def test_sandbox_statuses_are_counted_by_class(shim, web):
    """A server in a sandbox answers 40 different statuses through a preview
    link: the metrics count them by class (2xx…), so a sandbox cannot fill
    the shim's series table."""
    link = _link(shim, web)["path"]
    for code in range(200, 240):
        r = shim.request("GET", link + f"status/{code}", auth=False)
        assert r.status == code, r
    r = shim.request("GET", _path(web, "/status/299"))
    assert r.status == 299, r
    text = shim.request("GET", "/metrics").body.decode()
    proxied = [line for line in text.splitlines()
               if line.startswith("shim_requests_total{") and ('route="/p/{*}"' in line or "/ports/{port}/{*}" in line)]
    statuses = {line.split('status="')[1].split('"')[0] for line in proxied}
    # The shim's own answers on these routes (403, 429, 502…) keep their
    # number; none of them is a 2xx.
    assert "2xx" in statuses, sorted(statuses)
    assert not [s for s in statuses if s.isdigit() and 200 <= int(s) < 300], sorted(statuses)


def test_malformed_answers_are_502_saying_what_is_wrong(shim, web):
    """A server in the sandbox that answers with a head a proxy must not
    guess at (Content-Length with Transfer-Encoding, bare LF line ends,
    a folded header, two different lengths) gets the client a 502 naming
    the fault; equal repeated lengths are one length; a chunked body with
    a bad chunk size ends the answer cut short (never with a body the
    client could take as complete). The proxy goes on serving."""
    for name, why in (("cl-te", "both Content-Length and Transfer-Encoding"), ("bare-lf", "bare LF"),
                      ("obs-fold", "obs-fold"), ("two-lengths", "Content-Length values that differ")):
        r = shim.request("GET", _path(web, "/malformed/" + name))
        assert r.status == 502 and why in r.json()["detail"], (name, r)
    r = shim.request("GET", _path(web, "/malformed/same-lengths"))
    assert r.status == 200 and r.body == b"ok", r
    conn = shim.connection(30)
    try:
        conn.request("GET", _path(web, "/malformed/bad-chunk"), headers=shim.auth_headers())
        resp = conn.getresponse()
        assert resp.status == 200, resp.status
        with pytest.raises(http.client.IncompleteRead):
            resp.read()
    finally:
        conn.close()
    assert shim.request("GET", _path(web, "/echo")).status == 200


def test_interim_answers_are_capped(shim, web):
    """A server that sends a thousand interim (100) answers before its own
    gets 502; a few are skipped as before."""
    r = shim.request("GET", _path(web, "/interim/3"))
    assert r.status == 200 and r.json()["tag"] == web, r
    r = shim.request("GET", _path(web, "/interim/1000"))
    assert r.status == 502 and "interim" in r.json()["detail"], r


def test_a_link_without_ttl_lives_at_most_the_maximum(shims, gateway, web):
    """SHIM_PREVIEW_MAX_TTL_SECONDS=5: a link asked for without ttl_seconds
    expires within 5 s, not after the default hour."""
    shim = shims.shim(gateway, env={"SHIM_PREVIEW_MAX_TTL_SECONDS": "5"})
    before = time.time()
    r = shim.request("POST", f"/sandboxes/{web}/ports/{HTTP_PORT}/links", body={})
    assert r.status == 201, r
    assert r.json()["expires_at"] <= int(before) + 6, (r.json(), before)
