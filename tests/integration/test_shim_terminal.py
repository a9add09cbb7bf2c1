"""sandbox-shim: the WebSocket terminal of a detached process
(GET /sandboxes/{id}/processes/{pid}/terminal), driven by a real WebSocket
client — the `ws` package of Node.js, pinned in tests/integration/ws — the
way a browser terminal is: it types into bash on a pseudo-terminal and
reads the answers, resizes, interrupts, exits.

The detached processes are started through gRPC (Run with `detach`), not
through the shim. The client runs as a child (tests/integration/ws/term.js)
that speaks JSON lines; `npm ci` installs it on first use.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import socket
import subprocess
import threading
import time

import pytest

from tests.integration.test_runtime_processes import background, processes
from tests.lib.client import new_id, pb
from tests.lib.procs import RssSampler, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
WS_DIR = os.path.join(HERE, "ws")
TERM_JS = os.path.join(WS_DIR, "term.js")
BASH = ["bash", "--norc", "--noprofile", "-i"]
EVENT_TIMEOUT_S = 30


@pytest.fixture(scope="session")
def node():
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node or npm is not installed")
    if not os.path.isdir(os.path.join(WS_DIR, "node_modules", "ws")):
        try:
            r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=WS_DIR, capture_output=True, text=True,
                               timeout=600, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail("npm ci in tests/integration/ws timed out")
        if r.returncode != 0:
            pytest.fail("npm ci in tests/integration/ws failed: " + (r.stderr or r.stdout)[-800:])
    return node


class Term:
    """One WebSocket client (term.js) and what it has received."""

    def __init__(self, node: str, url: str, headers=None, protocols=None):
        opts = {"url": url, "headers": headers or {}, "protocols": protocols or []}
        self.proc = subprocess.Popen([node, TERM_JS, json.dumps(opts)], cwd=WS_DIR, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.events: queue.Queue = queue.Queue()
        self.output = b""
        self.texts: list[dict] = []
        self.closed = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"ev": "eof"})

    def next(self, timeout: float = EVENT_TIMEOUT_S) -> dict:
        ev = self.events.get(timeout=timeout)
        if ev["ev"] == "binary":
            self.output += base64.b64decode(ev["b64"])
        elif ev["ev"] == "text":
            self.texts.append(json.loads(ev["text"]))
        elif ev["ev"] in ("close", "eof"):
            self.closed = self.closed or ev
        return ev

    def first(self) -> dict:
        """The open event, or what came instead (an `http` answer)."""
        while True:
            ev = self.next()
            if ev["ev"] != "error":
                return ev

    def _cmd(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def type(self, data: bytes):
        self._cmd(op="binary", b64=base64.b64encode(data).decode())

    def control(self, obj: dict):
        self._cmd(op="text", text=json.dumps(obj))

    def read_until(self, text: bytes, timeout: float = EVENT_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while text not in self.output:
            left = deadline - time.monotonic()
            assert left > 0 and self.closed is None, f"{text!r} never came; got {self.output[-2000:]!r}"
            try:
                self.next(timeout=left)
            except queue.Empty:
                pass

    def wait_closed(self, timeout: float = EVENT_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while self.closed is None:
            self.next(timeout=max(0.1, deadline - time.monotonic()))
        return self.closed

    def close(self, code: int = 1000) -> dict:
        self._cmd(op="close", code=code)
        return self.wait_closed()

    def destroy(self):
        """Drops the connection without a close frame."""
        self._cmd(op="destroy")
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def terms(node):
    """Opens terminals: `terms(url, ...)`; all stopped at teardown."""
    opened = []

    def open_term(url, **kw) -> Term:
        t = Term(node, url, **kw)
        opened.append(t)
        return t

    try:
        yield open_term
    finally:
        for t in opened:
            t.stop()


@pytest.fixture
def box(sbx):
    sid = new_id("term")
    sbx.launch(sid)
    return sid


def url_of(shim, sid, pid, query=""):
    return f"ws://127.0.0.1:{shim.port}/sandboxes/{sid}/processes/{pid}/terminal{query}"


def start_bash(sbx, sid, pid="sh", rows=24, cols=80):
    background(sbx, sid, BASH, process_id=pid, pty=pb.PtySize(rows=rows, cols=cols))
    return pid


def open_bash(shim, terms, sid, pid, **kw) -> Term:
    t = terms(url_of(shim, sid, pid, kw.pop("query", "")), headers=shim.auth_headers(), **kw)
    ev = t.first()
    assert ev["ev"] == "open", ev
    return t


def raw_upgrade(shim, path, headers: dict) -> tuple[socket.socket, bytes]:
    """Sends a WebSocket opening handshake by hand; the socket and the
    answer's head."""
    s = socket.create_connection((shim.host, shim.port), timeout=30)
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    s.sendall(head.encode() + b"\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    return s, buf


def upgrade_headers(shim) -> dict:
    return {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", **shim.auth_headers()}


# ---- the terminal --------------------------------------------------------------------


def test_a_browser_terminal_types_into_bash_and_reads_the_answer(shim, sbx, box, terms):
    pid = start_bash(sbx, box)
    t = open_bash(shim, terms, box, pid)
    t.type(b"echo $((6*7))\n")
    t.read_until(b"42")
    assert t.closed is None


def test_resize_reaches_the_terminal(shim, sbx, box, terms):
    pid = start_bash(sbx, box, rows=24, cols=80)
    t = open_bash(shim, terms, box, pid)
    t.control({"type": "resize", "rows": 33, "cols": 111})
    t.type(b"stty size\n")
    t.read_until(b"33 111")


def test_ctrl_c_interrupts_the_foreground_job_and_the_shell_answers(shim, sbx, box, terms):
    pid = start_bash(sbx, box)
    t = open_bash(shim, terms, box, pid)
    t.type(b"sleep 100\n")
    wait_until(lambda: any(p.startswith("sleep 100") for p in sbx.exec(box, ["ps", "-e", "-o", "args="])
                           .out.splitlines()), timeout=20)
    began = time.monotonic()
    t.type(b"\x03")
    t.type(b"echo after-$((1+1))\n")
    t.read_until(b"after-2")
    assert time.monotonic() - began < 20


def test_exit_sends_the_exit_message_then_close_1000(shim, sbx, box, terms):
    pid = start_bash(sbx, box)
    t = open_bash(shim, terms, box, pid)
    t.type(b"exit 3\n")
    closed = t.wait_closed()
    assert closed["ev"] == "close" and closed["code"] == 1000, closed
    assert t.texts[-1] == {"type": "exit", "exit_code": 3, "signal": None, "timed_out": False}, t.texts


def test_a_signal_message_reaches_the_process_group(shim, sbx, box, terms):
    background(sbx, box, ["sleep", "1000"], process_id="sleeper")
    t = open_bash(shim, terms, box, "sleeper")
    t.control({"type": "signal", "signal": "SIGTERM"})
    closed = t.wait_closed()
    assert closed["code"] == 1000, closed
    assert t.texts[-1] == {"type": "exit", "exit_code": -15, "signal": 15, "timed_out": False}, t.texts


def test_bad_control_messages_get_an_error_and_the_terminal_stays(shim, sbx, box, terms):
    pid = start_bash(sbx, box)
    t = open_bash(shim, terms, box, pid)
    for bad in ({"type": "resize", "rows": 0, "cols": 80}, {"type": "signal", "signal": "SIGNOPE"},
                {"type": "dance"}, ["not", "an", "object"]):
        t.control(bad)
    t.type(b"echo still-$((2+3))\n")
    t.read_until(b"still-5")
    errors = [m for m in t.texts if m.get("type") == "error"]
    assert len(errors) == 4 and all(m["detail"] for m in errors), t.texts


def test_close_stdin_ends_a_shell_that_reads_eof(shim, sbx, box, terms):
    background(sbx, box, ["cat"], process_id="cat")
    t = open_bash(shim, terms, box, "cat")
    t.type(b"meow\n")
    t.read_until(b"meow")
    t.control({"type": "close_stdin"})
    assert t.wait_closed()["code"] == 1000
    assert t.texts[-1]["type"] == "exit" and t.texts[-1]["exit_code"] == 0, t.texts


def test_replay_sends_earlier_output_unless_turned_off(shim, sbx, box, terms):
    pid = start_bash(sbx, box)
    first = open_bash(shim, terms, box, pid)
    first.type(b"echo marker-$((40+2))\n")
    first.read_until(b"marker-42")
    first.close()
    again = open_bash(shim, terms, box, pid)  # replay=true by default
    again.read_until(b"marker-42")
    again.close()
    quiet = open_bash(shim, terms, box, pid, query="?replay=false")
    quiet.type(b"echo fresh-$((1+1))\n")
    quiet.read_until(b"fresh-2")
    assert b"marker-42" not in quiet.output


def test_closing_the_websocket_leaves_the_process_running(shim, sbx, box, terms):
    pid = start_bash(sbx, box)
    t = open_bash(shim, terms, box, pid)
    t.type(b"echo one-$((0+1))\n")
    t.read_until(b"one-1")
    assert t.close()["code"] == 1000
    time.sleep(0.5)
    assert processes(sbx, box)[pid].running
    again = open_bash(shim, terms, box, pid, query="?replay=false")
    again.type(b"echo two-$((1+1))\n")
    again.read_until(b"two-2")


# ---- authentication and refusals --------------------------------------------------------


def test_the_bearer_secret_may_come_as_a_subprotocol(shim, sbx, box, terms):
    pid = start_bash(sbx, box)
    t = terms(url_of(shim, box, pid), protocols=["terminal", f"bearer.{shim.secret}"])
    ev = t.first()
    assert ev == {"ev": "open", "protocol": "terminal"}, ev
    t.type(b"echo sub-$((3*3))\n")
    t.read_until(b"sub-9")
    # Only the bearer protocol offered: it is the one answered.
    only = terms(url_of(shim, box, pid), protocols=[f"bearer.{shim.secret}"])
    assert only.first() == {"ev": "open", "protocol": f"bearer.{shim.secret}"}


@pytest.mark.parametrize("how", ["wrong subprotocol", "no token", "wrong header"])
def test_a_wrong_or_missing_token_is_401_before_the_upgrade(shim, sbx, box, terms, how):
    pid = start_bash(sbx, box)
    kw = {"wrong subprotocol": {"protocols": ["terminal", "bearer.not-the-secret"]}, "no token": {},
          "wrong header": {"headers": {"Authorization": "Bearer not-the-secret"}}}[how]
    ev = terms(url_of(shim, box, pid), **kw).first()
    assert ev["ev"] == "http" and ev["status"] == 401, ev
    assert json.loads(ev["body"]) == {"detail": "Invalid or missing bearer token"}


def test_an_unknown_process_or_sandbox_is_404(shim, box, terms):
    for sid, pid in ((box, "nosuch"), (new_id("missing"), "nosuch")):
        ev = terms(url_of(shim, sid, pid), headers=shim.auth_headers()).first()
        assert ev["ev"] == "http" and ev["status"] == 404, ev


def test_a_request_that_is_not_a_websocket_upgrade_is_400(shim, sbx, box):
    pid = start_bash(sbx, box)
    path = f"/sandboxes/{box}/processes/{pid}/terminal"
    r = shim.request("GET", path)
    assert r.status == 400 and "WebSocket" in r.json()["detail"], r
    for change in ({"Sec-WebSocket-Version": "8"}, {"Sec-WebSocket-Key": "c2hvcnQ="}, {"Upgrade": "h2c"}):
        s, head = raw_upgrade(shim, path, {**upgrade_headers(shim), **change})
        s.close()
        assert head.startswith(b"HTTP/1.1 400"), (change, head)


def test_bad_ids_are_422(shim):
    for path in ("/sandboxes/-bad/processes/p/terminal", "/sandboxes/ok/processes/-bad/terminal"):
        r = shim.request("GET", path, headers={"Upgrade": "websocket"})
        assert r.status == 422, (path, r)


# ---- the shim around terminals ---------------------------------------------------------


def test_the_shim_keeps_serving_after_an_abrupt_disconnect(shim, sbx, box, terms):
    pid = start_bash(sbx, box)
    path = f"/sandboxes/{box}/processes/{pid}/terminal"
    for _ in range(3):
        s, head = raw_upgrade(shim, path, upgrade_headers(shim))
        assert head.startswith(b"HTTP/1.1 101"), head
        assert b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head  # RFC 6455's example key and answer
        # A reset, not a close frame: the client vanished.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    assert wait_until(lambda: len(shim.logs.find(lambda r: r.get("message") == "terminal closed"
                                                     and r.get("process_id") == pid)) >= 3, timeout=10)
    assert shim.request("GET", "/health", auth=False).status == 200
    assert processes(sbx, box)[pid].running
    t = open_bash(shim, terms, box, pid)
    t.type(b"echo alive-$((5+5))\n")
    t.read_until(b"alive-10")


def test_an_idle_terminal_outlives_the_header_and_idle_timeouts(shims, gateway, sbx, box, terms):
    s = shims.shim(gateway, env={"SHIM_HEADER_TIMEOUT": "1", "SHIM_BODY_TIMEOUT": "1",
                                 "SHIM_CONNECTION_TIMEOUT": "1"})
    pid = start_bash(sbx, box)
    t = open_bash(s, terms, box, pid)
    time.sleep(3.5)
    t.type(b"echo late-$((2*2))\n")
    t.read_until(b"late-4")
    assert t.closed is None


def test_terminals_are_capped_and_a_closed_one_frees_its_slot(shims, gateway, sbx, box, terms):
    s = shims.shim(gateway, env={"SHIM_MAX_TERMINALS": "1"})
    pid = start_bash(sbx, box)
    first = open_bash(s, terms, box, pid)
    ev = terms(url_of(s, box, pid), headers=s.auth_headers()).first()
    assert ev["ev"] == "http" and ev["status"] == 429, ev
    first.destroy()
    second = wait_until(lambda: (lambda t: t if t.first()["ev"] == "open" else None)(
        terms(url_of(s, box, pid), headers=s.auth_headers())), timeout=10)
    assert second is not None
    second.type(b"echo slot-$((7+1))\n")
    second.read_until(b"slot-8")


def test_a_stopping_shim_closes_its_terminals_with_1001_and_exits_0(shims, gateway, sbx, box, terms):
    s = shims.shim(gateway)
    pid = start_bash(sbx, box)
    t = open_bash(s, terms, box, pid)
    t.type(b"echo up-$((1+2))\n")
    t.read_until(b"up-3")
    assert s.stop() == 0, s.describe()
    closed = t.wait_closed()
    assert closed["ev"] == "close" and closed["code"] == 1001, closed
    assert processes(sbx, box)[pid].running


def _flood_socket(shim) -> socket.socket:
    """A connection whose receive buffer is small, so that what the shim
    writes to it backs up at once when nobody reads."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect((shim.host, shim.port))
    return s


@pytest.mark.parametrize("frame", ["ping", "text"])
def test_a_client_that_floods_and_never_reads_is_closed_with_flat_memory(shims, gateway, sbx, box, frame):
    """A terminal client sends empty pings (each asks for a pong) or 1-byte
    text frames (each asks for an error reply) as fast as it can and never
    reads. The shim stops reading it once its answers back up, closes it,
    and its resident memory stays flat; it keeps serving."""
    s = shims.shim(gateway)
    pid = start_bash(sbx, box)
    sock = _flood_socket(s)
    path = f"/sandboxes/{box}/processes/{pid}/terminal"
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in upgrade_headers(s).items())
    sock.sendall(head.encode() + b"\r\n")
    got = b""
    while b"\r\n\r\n" not in got:
        piece = sock.recv(4096)
        assert piece, got
        got += piece
    assert got.startswith(b"HTTP/1.1 101"), got
    # Masked client frames: an empty PING, or a text frame "x".
    one = b"\x89\x80\x01\x02\x03\x04" if frame == "ping" else b"\x81\x81\x01\x02\x03\x04" + bytes([ord("x") ^ 1])
    burst = one * 10000
    sock.settimeout(0.5)
    sent = stalls = 0
    closed = False
    deadline = time.monotonic() + 12.0
    with RssSampler(s.pid) as rss:
        while time.monotonic() < deadline and s.alive():
            try:
                sent += sock.send(burst)
            except socket.timeout:
                stalls += 1  # the shim no longer reads us
            except OSError:
                closed = True  # the shim closed the connection
                break
    sock.close()
    assert s.alive(), s.describe()
    assert rss.growth_mib < 64, f"shim VmRSS grew {rss.growth_mib:.0f} MiB under {sent} bytes of {frame} frames"
    assert closed or stalls > 0, (sent, stalls)
    assert wait_until(lambda: len(s.logs.find(lambda r: r.get("message") == "terminal closed"
                                              and r.get("process_id") == pid)) >= 1, timeout=15)
    assert s.request("GET", "/health", auth=False).status == 200
    assert processes(sbx, box)[pid].running
