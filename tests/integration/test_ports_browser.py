"""A real browser through a preview link: headless Chromium opens a link
(no bearer) to a page served in a sandbox without egress; the page's script
opens a WebSocket back through the same link (a URL relative to the page)
and writes the echo it gets into the DOM, which Chromium prints.

Skipped only when the `chromium` binary is not installed
(scripts/install-deps.sh installs it); a browser that is there but fails is
a failure."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest

from tests.lib.client import new_id
from tests.lib.ports import start_detached, wait_listening

PORT = 8080
BROWSER_TIMEOUT_S = 90

# The page. Its script reaches the WebSocket at "<the page's path>ws", so
# through a link /p/<token>/ the socket is /p/<token>/ws, and the server in
# the sandbox sees /ws.
PAGE = r"""<!doctype html>
<html><head><title>sandbox page</title></head>
<body>
<div id=loaded>page-loaded</div>
<div id=result>ws-pending</div>
<script>
const out = document.getElementById('result');
out.textContent = 'ws-connecting';
const ws = new WebSocket('ws://' + location.host + location.pathname + 'ws');
ws.onopen = () => ws.send('hello-from-page');
ws.onmessage = (m) => { out.textContent = 'ws-ok:' + m.data; ws.close(); };
ws.onerror = () => { out.textContent = 'ws-error'; };
ws.onclose = (e) => { if (!out.textContent.startsWith('ws-ok')) out.textContent = 'ws-closed:' + e.code; };
// Headless Chromium's virtual time does not wait for a WebSocket, only for
// fetches: keep one pending (the server answers it after 200 ms of real
// time) until the socket has had its say, so a slow machine is not read
// as a failure.
(async () => {
  for (let i = 0; i < 150 && ['ws-pending', 'ws-connecting'].includes(out.textContent); i++)
    await fetch(location.pathname + 'hold').catch(() => {});
})();
</script>
</body></html>
"""

# The server in the sandbox, stdlib only: GET / is the page (argv[2]);
# GET /ws with an Upgrade is a WebSocket (RFC 6455) that answers the first
# text frame with "echo:<its text>" and closes.
SERVER = r"""
import base64, hashlib, struct, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PAGE = sys.argv[2].encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def read_frame(self):
        b0, b1 = self.rfile.read(2)
        n = b1 & 0x7F
        if n == 126: n = struct.unpack("!H", self.rfile.read(2))[0]
        elif n == 127: n = struct.unpack("!Q", self.rfile.read(8))[0]
        mask = self.rfile.read(4) if b1 & 0x80 else b"\0\0\0\0"
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.rfile.read(n)))
        return b0 & 0x0F, data
    def send_frame(self, opcode, data):
        n = len(data)
        head = bytes([0x80 | opcode]) + (bytes([n]) if n < 126 else bytes([126]) + struct.pack("!H", n))
        self.wfile.write(head + data)
        self.wfile.flush()
    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        opcode, data = self.read_frame()
        if opcode == 1:
            self.send_frame(1, b"echo:" + data)
        opcode, data = self.read_frame()  # the page's close
        self.send_frame(8, data[:2])
        self.close_connection = True
    def do_GET(self):
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        if self.path == "/hold":
            time.sleep(0.2)
            self.send_response(204)
            self.end_headers()
            return
        if self.path != "/":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)
ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture(scope="module")
def chromium():
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("the chromium binary is not installed (Debian package `chromium`)")
    return path


@pytest.fixture(scope="module")
def page_box(sbx):
    sid = new_id("browser")
    sbx.launch(sid)
    start_detached(sbx, sid, ["python3", "-c", SERVER, str(PORT), PAGE])
    wait_listening(sbx, sid, PORT)
    return sid


def _dump_dom(chromium: str, url: str) -> str:
    """The DOM Chromium has after loading `url` and running its scripts."""
    with tempfile.TemporaryDirectory(prefix="sgw-chromium-") as profile:
        # As root Chromium refuses to start without --no-sandbox.
        argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", url]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S,
                           env={"HOME": profile, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    return r.stdout


def test_a_browser_loads_a_page_and_its_websocket_through_a_preview_link(shim, page_box, chromium):
    r = shim.request("POST", f"/sandboxes/{page_box}/ports/{PORT}/links", body={"ttl_seconds": 600})
    assert r.status == 201, r
    url = r.json()["url"]
    assert url.startswith(f"http://{shim.host}:{shim.port}/p/"), url
    dom = _dump_dom(chromium, url)
    assert '<div id="loaded">page-loaded</div>' in dom, dom
    assert '<div id="result">ws-ok:echo:hello-from-page</div>' in dom, dom
