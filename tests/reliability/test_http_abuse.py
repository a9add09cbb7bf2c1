"""HTTP abuse against sandbox-shim: slow clients, huge declared bodies,
broken chunked encoding, huge headers, floods of idle connections.

Whatever a client does to its own connection, the shim must keep answering
a well-behaved client (a `HealthProbe` polls /health throughout), bound its
memory, and let go of the abusive connections.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import socket
import tarfile
import threading
import time

import pytest

from tests.lib.procs import RssSampler, vm_rss_kib, wait_until
from tests.lib.shim import HealthProbe, health_ok, peer_closed, raw_connect, read_response_head, status_of

# Every abuse below runs at most this long.
ABUSE_BOUND_S = 30.0


def _auth(shim) -> bytes:
    return f"Authorization: Bearer {shim.secret}\r\n".encode()


def _trickle(socks: list, payload: bytes, bound_s: float, interval: float = 1.0) -> dict:
    """Sends `payload` one byte per `interval` on every socket of `socks`
    (one driver loop for all of them) until the server closed each one or
    `bound_s` passed. Returns {socket: bytes the server sent before closing
    (possibly b"")} for the closed ones."""
    closed: dict = {}
    deadline = time.monotonic() + bound_s
    i = 0
    while len(closed) < len(socks) and time.monotonic() < deadline:
        for s in socks:
            if s in closed:
                continue
            if i < len(payload):
                try:
                    s.send(payload[i:i + 1])
                except OSError:
                    closed[s] = b""
                    continue
            # Anything the server said, or its EOF.
            s.setblocking(False)
            try:
                data = s.recv(65536)
                if data == b"" or status_of(data) is not None:
                    closed[s] = data
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed[s] = b""
            finally:
                s.setblocking(True)
        i += 1
        time.sleep(interval)
    return closed


@pytest.fixture
def shim_t3(procs):
    """A gateway and a shim with SHIM_CONNECTION_TIMEOUT=3."""
    gw = procs.gateway()
    return procs.shim(gw, env={"SHIM_CONNECTION_TIMEOUT": "3"})


# --- slow clients ---------------------------------------------------------------------

@pytest.mark.finding("R1")
def test_slowloris_headers_are_dropped_and_a_normal_client_is_served(shim_t3):
    """100 connections send their request head one byte per second and never
    finish it. A normal client is served meanwhile, and the shim drops the
    slow ones (or answers 408) within the bound: SHIM_CONNECTION_TIMEOUT=3
    must not be renewable forever one byte at a time."""
    shim = shim_t3
    head = (b"GET /health HTTP/1.1\r\nHost: slow\r\nUser-Agent: slowloris\r\nX-Pad: "
            + b"a" * 200)  # never terminated: longer than the bound in bytes
    socks = [raw_connect(shim) for _ in range(100)]
    try:
        with HealthProbe(shim) as probe:
            closed = _trickle(socks, head, ABUSE_BOUND_S)
        assert probe.failures == [], probe.failures
        assert probe.ok > 0
        still_open = len(socks) - len(closed)
        statuses = {status_of(v) for v in closed.values()}
        assert statuses <= {None, 408, 400}, statuses
        assert still_open == 0, (
            f"{still_open} of 100 slowloris connections still open after {ABUSE_BOUND_S:.0f}s "
            f"with SHIM_CONNECTION_TIMEOUT=3 (one header byte a second renews the idle timeout)")
    finally:
        for s in socks:
            s.close()
    assert health_ok(shim)


@pytest.mark.finding("R1")
def test_slowloris_cannot_lock_normal_clients_out(procs):
    """With SHIM_MAX_CONNECTIONS=32, 32 slowloris connections take every
    slot. Their idle timeout (3 s) must still end them, so a normal client
    gets /health within the bound."""
    gw = procs.gateway()
    shim = procs.shim(gw, env={"SHIM_CONNECTION_TIMEOUT": "3", "SHIM_MAX_CONNECTIONS": "32"})
    head = b"GET /health HTTP/1.1\r\nHost: slow\r\nX-Pad: " + b"a" * 200
    socks = [raw_connect(shim) for _ in range(32)]
    stop = threading.Event()

    def trickle():
        i = 0
        while not stop.is_set() and i < len(head):
            for s in socks:
                with contextlib.suppress(OSError):
                    s.send(head[i:i + 1])
            i += 1
            stop.wait(1.0)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        time.sleep(1.0)
        served = wait_until(lambda: health_ok(shim, timeout=3.0), ABUSE_BOUND_S, interval=1.0)
        assert served, (f"32 slowloris connections locked every client out of the shim for "
                        f"{ABUSE_BOUND_S:.0f}s (SHIM_MAX_CONNECTIONS=32, SHIM_CONNECTION_TIMEOUT=3)")
    finally:
        stop.set()
        t.join(5)
        for s in socks:
            s.close()
    assert wait_until(lambda: health_ok(shim), 20.0, interval=0.5)


@pytest.mark.finding("R1")
@pytest.mark.parametrize("route", ["/sandboxes", "/sandboxes/slowbody/restore"])
def test_slow_bodies_are_dropped_and_a_normal_client_is_served(shim_t3, route):
    """20 clients declare a body and send it one byte per second. A normal
    client is served meanwhile; the shim drops the slow ones (or answers
    408) within the bound; no sandbox comes out of it."""
    shim = shim_t3
    ctype = "application/json" if route == "/sandboxes" else "application/x-tar"
    head = (f"POST {route} HTTP/1.1\r\nHost: slow\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: 4096\r\n").encode() + _auth(shim) + b"\r\n"
    socks = [raw_connect(shim) for _ in range(20)]
    try:
        for s in socks:
            s.sendall(head)
        body = b'{"sandbox_id": "' + b"x" * 4000 if route == "/sandboxes" else b"\0" * 4096
        with HealthProbe(shim) as probe:
            closed = _trickle(socks, body, ABUSE_BOUND_S)
        assert probe.failures == [], probe.failures
        assert probe.ok > 0
        still_open = len(socks) - len(closed)
        assert still_open == 0, (
            f"{still_open} of 20 slow-body connections still open after {ABUSE_BOUND_S:.0f}s "
            f"with SHIM_CONNECTION_TIMEOUT=3")
    finally:
        for s in socks:
            s.close()
    r = shim.request("GET", "/sandboxes")
    assert r.status == 200, r
    assert r.json()["sandboxes"] == [], r


# --- huge declared bodies -------------------------------------------------------------

@pytest.mark.parametrize("route", ["/sandboxes", "/sandboxes/huge/exec", "/sandboxes/huge/restore"])
def test_a_declared_10gb_body_is_refused_at_once(procs, route):
    """Content-Length: 10 GB: 413 before a byte of body is sent (the client
    sends none, so an answer proves the shim did not wait for it)."""
    gw = procs.gateway()
    shim = procs.shim(gw)
    with HealthProbe(shim) as probe:
        s = raw_connect(shim)
        try:
            s.sendall(f"POST {route} HTTP/1.1\r\nHost: big\r\nContent-Type: application/json\r\n"
                      f"Content-Length: 10000000000\r\n".encode() + _auth(shim) + b"\r\n")
            head = read_response_head(s, 10.0)
        finally:
            s.close()
    assert status_of(head) == 413, head
    assert probe.failures == [], probe.failures
    r = shim.request("GET", "/sandboxes")
    assert r.status == 200 and r.json()["sandboxes"] == [], r


@pytest.mark.parametrize("length", ["99999999999999999999999", "-1", "1e10", "12abc", "5, 5"])
def test_a_nonsense_content_length_is_refused(procs, length):
    """A Content-Length that is not a number, overflows 64 bits or repeats:
    400 or 413 (or the connection closed), and the shim keeps serving."""
    gw = procs.gateway()
    shim = procs.shim(gw)
    s = raw_connect(shim)
    try:
        s.sendall(f"POST /sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {length}\r\n".encode() + _auth(shim) + b"\r\n")
        head = read_response_head(s, 10.0)
    finally:
        s.close()
    assert head == b"" or status_of(head) in (400, 413), head
    assert health_ok(shim)
    r = shim.request("GET", "/sandboxes")
    assert r.status == 200 and r.json()["sandboxes"] == [], r


def _tar_of(size: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("root/blob")
        info.size = size
        tf.addfile(info, io.BytesIO(b"\xa5" * size))
    return buf.getvalue()


def test_a_streamed_restore_over_the_cap_is_refused_and_leaves_no_sandbox(procs):
    """SHIM_MAX_RESTORE_BYTES=1 MiB and a chunked (undeclared) 3 MiB tar:
    413, and the partial restore does not leave a sandbox behind."""
    gw = procs.gateway()
    shim = procs.shim(gw, env={"SHIM_MAX_RESTORE_BYTES": str(1 << 20)})
    data = _tar_of(3 << 20)
    conn = shim.connection(60)
    try:
        conn.putrequest("POST", "/sandboxes/overcap/restore")
        conn.putheader("Authorization", f"Bearer {shim.secret}")
        conn.putheader("Content-Type", "application/x-tar")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        with contextlib.suppress(OSError):
            for off in range(0, len(data), 64 * 1024):
                piece = data[off:off + 64 * 1024]
                conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        status = resp.status
        resp.read()
    finally:
        conn.close()
    assert status == 413
    # The gateway must not keep a half-restored sandbox.
    gone = wait_until(lambda: shim.request("GET", "/sandboxes").json()["sandboxes"] == [], 15.0, 0.5)
    assert gone, shim.request("GET", "/sandboxes")
    assert wait_until(lambda: gw.leftovers() == [], 15.0, 0.2), gw.leftovers()
    assert health_ok(shim)


# --- broken chunked encoding and huge headers ----------------------------------------

BAD_CHUNKS = {
    "not-hex": b"ZZZ\r\nabc\r\n0\r\n\r\n",
    "over-64-bits": b"FFFFFFFFFFFFFFFFFFFFFF\r\nabc\r\n",
    "2^64": b"10000000000000000\r\nabc",
    "negative": b"-1\r\nabc\r\n",
    "longer-than-declared": b"5\r\nabcdefghij\r\n0\r\n\r\n",
    "no-crlf": b"5abcde0\r\n\r\n",
    "huge-but-plausible": b"7FFFFFFFFFFFFFFF\r\nabc",
    "extension-garbage": b"3;" + b"x" * 70000 + b"\r\nabc\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(BAD_CHUNKS))
@pytest.mark.parametrize("route", ["/sandboxes", "/sandboxes/chunky/restore"])
def test_bad_chunked_bodies_are_refused(procs, name, route):
    gw = procs.gateway()
    shim = procs.shim(gw)
    s = raw_connect(shim)
    try:
        s.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Transfer-Encoding: chunked\r\n".encode() + _auth(shim) + b"\r\n")
        with contextlib.suppress(OSError):
            s.sendall(BAD_CHUNKS[name])
        head = read_response_head(s, 10.0)
        if head is None:
            # Still waiting for more body: it must at least not hang forever
            # once the client stops (the half-close ends the request).
            s.shutdown(socket.SHUT_WR)
            head = read_response_head(s, 10.0)
    finally:
        s.close()
    status = status_of(head)
    assert head == b"" or (status is not None and 400 <= status < 500), head
    assert health_ok(shim)
    assert shim.alive()
    r = shim.request("GET", "/sandboxes")
    assert r.status == 200 and r.json()["sandboxes"] == [], r


@pytest.mark.parametrize("shape", ["one-header", "many-headers", "long-url"])
def test_a_1mb_request_head_is_refused(procs, shape):
    gw = procs.gateway()
    shim = procs.shim(gw)
    if shape == "one-header":
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    elif shape == "many-headers":
        head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(
            b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(10000)) + b"\r\n"
    else:
        head = b"GET /health?" + b"q" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    with HealthProbe(shim) as probe:
        s = raw_connect(shim)
        try:
            with contextlib.suppress(OSError):
                s.sendall(head)
            got = read_response_head(s, 10.0)
        finally:
            s.close()
    assert got == b"" or status_of(got) in (400, 414, 431), got
    assert probe.failures == [], probe.failures
    assert health_ok(shim)


# --- floods of idle connections -------------------------------------------------------

def _raise_nofile(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def test_many_idle_connections_are_bounded_and_released(procs):
    """2000 idle connections against SHIM_MAX_CONNECTIONS=512: at most 512
    stay open (the rest are refused or closed), resident memory stays
    bounded, the idle timeout closes the rest, and a normal client is served
    once they are gone."""
    _raise_nofile(4096)
    gw = procs.gateway()
    shim = procs.shim(gw, env={"SHIM_MAX_CONNECTIONS": "512", "SHIM_CONNECTION_TIMEOUT": "5"})
    assert health_ok(shim)
    threads_before = len(os.listdir(f"/proc/{shim.pid}/task"))
    socks: list[socket.socket] = []
    refused = 0
    try:
        with RssSampler(shim.pid) as rss:
            for _ in range(2000):
                try:
                    socks.append(socket.create_connection((shim.host, shim.port), timeout=5))
                except OSError:
                    refused += 1
            time.sleep(1.0)
            open_now = [s for s in socks if not peer_closed(s, 0.001)]
            assert len(open_now) <= 512 + 8, (len(open_now), refused)
            # The idle timeout (5 s) ends the survivors.
            all_closed = wait_until(lambda: all(peer_closed(s, 0.001) for s in open_now), 30.0, 0.5)
            assert all_closed, sum(1 for s in open_now if not peer_closed(s, 0.001))
        assert rss.growth_mib < 200, f"shim VmRSS grew {rss.growth_mib:.0f} MiB"
    finally:
        for s in socks:
            s.close()
    assert wait_until(lambda: health_ok(shim, 5.0), 20.0, 0.5)
    # Its connection threads are gone too.
    settled = wait_until(lambda: len(os.listdir(f"/proc/{shim.pid}/task")) <= threads_before + 4, 20.0, 0.5)
    assert settled, (threads_before, len(os.listdir(f"/proc/{shim.pid}/task")))


@pytest.mark.parametrize("n", [200])
def test_connections_that_open_and_reset_at_once_do_not_hurt(procs, n):
    """Connections that send half a request and reset (RST), repeatedly:
    the shim keeps serving and its memory and threads settle."""
    import struct
    gw = procs.gateway()
    shim = procs.shim(gw)
    before = vm_rss_kib(shim.pid)
    with HealthProbe(shim) as probe:
        for i in range(n):
            s = raw_connect(shim)
            with contextlib.suppress(OSError):
                s.send(b"POST /sandboxes HTTP/1.1\r\nContent-Length: 100\r\n" + _auth(shim) + b"\r\n{")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
    assert probe.failures == [], probe.failures
    assert health_ok(shim)
    assert (vm_rss_kib(shim.pid) - before) / 1024 < 64


# --- clients that only hold connections -------------------------------------------------

class Holders:
    """Connections from the loopback addresses `sources` (each a distinct
    client to the shim), `per_source` of them each, that send `request`
    (perhaps only half a head) every `every` seconds on a background thread,
    opening again those the shim closed or refused. `opened` counts the
    connections made, `answered` the answers read."""

    def __init__(self, shim, sources: list[str], per_source: int, request: bytes, every: float):
        self.shim, self.request, self.every = shim, request, every
        self.slots: list = [(src, None) for src in sources for _ in range(per_source)]
        self.opened = self.answered = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, src: str):
        with contextlib.suppress(OSError):
            s = socket.create_connection((self.shim.host, self.shim.port), timeout=1.0, source_address=(src, 0))
            self.opened += 1
            s.sendall(self.request)
            s.setblocking(False)
            return s
        return None

    def _round(self) -> None:
        for i, (src, s) in enumerate(self.slots):
            if self.stop.is_set():
                return
            if s is not None:
                try:
                    data = s.recv(65536)
                    if data == b"":
                        raise ConnectionResetError
                    self.answered += data.count(b"HTTP/1.1 ")
                    s.send(self.request)
                except (BlockingIOError, InterruptedError):
                    with contextlib.suppress(OSError):
                        s.send(self.request)
                except OSError:
                    s.close()
                    s = None
            if s is None:
                s = self._open(src)
            self.slots[i] = (src, s)

    def _run(self) -> None:
        while not self.stop.is_set():
            self._round()
            self.stop.wait(self.every)

    def __enter__(self):
        self._round()  # the first round before the test goes on
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)
        for _, s in self.slots:
            if s is not None:
                s.close()
        return False


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _timed_execs(shim, sid: str, n: int) -> list[float]:
    """`n` execs a second apart, each on a new connection: their times
    (each must answer 200)."""
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        r = shim.request("POST", f"/sandboxes/{sid}/exec", {"argv": ["true"]}, timeout=30)
        times.append(time.monotonic() - t0)
        assert r.status == 200, r
        time.sleep(1.0)
    return times


def _launch(shim) -> str:
    sid = f"abuse-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    r = shim.request("POST", "/sandboxes", {"sandbox_id": sid})
    assert r.status == 201, r
    return sid


def test_keepalive_health_clients_from_many_addresses_leave_room_for_an_exec(procs):
    """SHIM_MAX_CONNECTIONS=128, SHIM_MAX_CONNECTIONS_PER_CLIENT=32: 256
    keep-alive connections from 8 addresses ask GET /health (no token)
    every 5 s and open again what is closed. They reach the total cap; the
    shim closes idle connections first and, near the cap, closes each
    answered one: an authenticated exec from another address is answered
    throughout, and the shim's threads stay bounded by its cap."""
    _raise_nofile(4096)
    gw = procs.gateway()
    shim = procs.shim(gw, env={"SHIM_MAX_CONNECTIONS": "128", "SHIM_MAX_CONNECTIONS_PER_CLIENT": "32"})
    sid = _launch(shim)
    base = _threads(shim.pid)
    sources = [f"127.0.0.{i}" for i in range(2, 10)]
    with Holders(shim, sources, 32, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", every=5.0) as h:
        time.sleep(1.5)
        times = _timed_execs(shim, sid, 6)
        threads = _threads(shim.pid)
    assert h.answered > 0 and h.opened >= 128, (h.opened, h.answered)
    assert max(times) < 5.0, times
    assert threads <= base + 128 + 8, (base, threads)
    assert wait_until(lambda: health_ok(shim), 20.0, 0.5)


def test_half_sent_heads_from_one_address_are_capped(procs):
    """1100 connections from one address send half a request head and
    nothing more, and are opened again as they are closed. At most
    SHIM_MAX_CONNECTIONS_PER_CLIENT (256) of them are kept: clients from
    other addresses are served at once, with an authenticated exec, and the
    shim's threads stay bounded by that cap."""
    _raise_nofile(4096)
    gw = procs.gateway()
    shim = procs.shim(gw)
    sid = _launch(shim)
    base = _threads(shim.pid)
    with Holders(shim, ["127.0.0.2"], 1100, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: aaaa", every=2.0) as h:
        time.sleep(1.0)
        assert health_ok(shim, timeout=5.0)
        times = _timed_execs(shim, sid, 4)
        threads = _threads(shim.pid)
    assert h.opened >= 1100, h.opened
    assert max(times) < 5.0, times
    assert threads <= base + 256 + 8, (base, threads)


# --- connections cost no thread; work is bounded by SHIM_MAX_WORKERS --------------------

def test_a_thousand_held_connections_hold_no_threads(procs):
    """1024 keep-alive connections from 4 addresses that were answered once
    (GET /health, no token) and then only stay open, and 256 more that sent
    half a head, all open at once: the shim's thread count does not grow
    with them (MHD's event loops serve every connection; a thread is taken
    only while a request is worked on), and an authenticated exec from
    another address is answered within 1 s each time."""
    _raise_nofile(8192)
    gw = procs.gateway()
    shim = procs.shim(gw, env={"SHIM_MAX_CONNECTIONS": "2048", "SHIM_MAX_CONNECTIONS_PER_CLIENT": "300"})
    sid = _launch(shim)
    base = _threads(shim.pid)
    sources = [f"127.0.0.{i}" for i in range(2, 6)]
    with Holders(shim, sources, 256, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", every=5.0) as kept, \
            Holders(shim, ["127.0.0.7"], 256, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: a", every=5.0) as half:
        time.sleep(1.0)
        open_now = len(os.listdir(f"/proc/{shim.pid}/fd"))
        threads = _threads(shim.pid)
        times = _timed_execs(shim, sid, 4)
    assert kept.opened >= 1024 and kept.answered >= 1024 and half.opened >= 256, (kept.opened, kept.answered,
                                                                                   half.opened)
    assert open_now >= 1024 + 256, open_now  # they were all open at once
    assert threads <= base + 24, (base, threads)
    assert max(times) < 1.0, times


def test_work_beyond_the_workers_waits_in_order_and_is_answered(procs):
    """SHIM_MAX_WORKERS=2: two execs that sleep 3 s hold both workers; 6
    more requests meanwhile wait for one (not refused, not lost) and are all
    answered once the first two end; the threads stay at the cap."""
    gw = procs.gateway()
    shim = procs.shim(gw, env={"SHIM_MAX_WORKERS": "2"})
    sid = _launch(shim)
    base = _threads(shim.pid)
    results: list = []

    def run(argv):
        r = shim.request("POST", f"/sandboxes/{sid}/exec", {"argv": argv}, timeout=60)
        results.append((argv[0], r.status, time.monotonic()))

    t0 = time.monotonic()
    slow = [threading.Thread(target=run, args=(["sleep", "3"],)) for _ in range(2)]
    for t in slow:
        t.start()
    time.sleep(0.5)
    threads_busy = _threads(shim.pid)
    quick = [threading.Thread(target=run, args=(["true"],)) for _ in range(6)]
    for t in quick:
        t.start()
    for t in slow + quick:
        t.join(60)
    assert sorted(s for _, s, _ in results) == [200] * 8, results
    # The quick ones waited for a worker: none ended before the sleeps did.
    first_quick = min(at for name, _, at in results if name == "true")
    assert first_quick - t0 >= 2.5, results
    assert threads_busy <= base + 2 + 2, (base, threads_busy)


def test_a_request_that_waits_too_long_for_a_worker_is_answered_503(procs):
    """SHIM_MAX_WORKERS=1 and an exec that sleeps 14 s: a request that
    waits for the worker longer than 10 s gets 503 (retry), not an answer
    that never comes; the long exec still ends with 200."""
    gw = procs.gateway()
    shim = procs.shim(gw, env={"SHIM_MAX_WORKERS": "1"})
    sid = _launch(shim)
    out: dict = {}

    def long_exec():
        out["long"] = shim.request("POST", f"/sandboxes/{sid}/exec", {"argv": ["sleep", "14"]}, timeout=60).status

    t = threading.Thread(target=long_exec)
    t.start()
    time.sleep(0.5)
    r = shim.request("GET", f"/sandboxes/{sid}", timeout=60)
    t.join(60)
    assert r.status == 503, r
    assert "busy" in r.json()["detail"], r.json()
    assert out["long"] == 200, out
    assert shim.request("GET", f"/sandboxes/{sid}").status == 200


def test_sigterm_during_a_half_sent_upload_stops_the_daemon_cleanly(procs):
    """A client sends half of a streamed file upload and stops sending. On
    SIGTERM the shim still stops its HTTP daemon cleanly (closing that
    connection): it does not take the upload's resumed connection for work
    still under way, and exits 0 at once."""
    gw = procs.gateway()
    shim = procs.shim(gw)
    sid = _launch(shim)
    s = raw_connect(shim)
    try:
        head = (f"PUT /sandboxes/{sid}/files?path=/tmp/half HTTP/1.1\r\nHost: x\r\n".encode() + _auth(shim)
                + b"Content-Length: 4194304\r\n\r\n")
        s.sendall(head + b"x" * 262144)
        time.sleep(1.0)
        t0 = time.monotonic()
        assert shim.stop(timeout=20) == 0, shim.describe()
        took = time.monotonic() - t0
        log = "\n".join(shim.logs.snapshot())
        assert "still being answered" not in log, log[-3000:]
        assert '"stopped"' in log or "stopped\n" in log + "\n", log[-3000:]
        assert took < 10, took
        s.settimeout(5)
        with contextlib.suppress(OSError):
            while s.recv(65536):
                pass  # the shim closed it (EOF or reset)
    finally:
        s.close()
