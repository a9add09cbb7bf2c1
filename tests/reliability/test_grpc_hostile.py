"""Hostile HTTP/2 clients without the secret, against sandbox-gateway's port:
a rapid reset (HEADERS then RST_STREAM as fast as one connection carries
them), refused calls on connections that never read, and thousands of idle
connections. While each attack runs (bounded in time, loopback only, from
addresses of its own), an authenticated client execs in a sandbox: its
latency stays low, and the gateway's threads, descriptors and resident
memory stay under stated bounds; the gateway never dies.

The attackers run in processes of their own (spawned), so that they do not
share the test's interpreter lock with the measured client."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import threading
import time

import pytest

from tests.lib.client import collect, sandbox_client
from tests.lib.gateway import running_gateway
from tests.reliability import h2raw

ATTACK_S = 15.0
# The bound for an authenticated exec's p99 under attack. The CI
# machine is small and shared (two cores for everything, the attacker
# included); override with SANDBOX_TEST_HOSTILE_P99_MS where it is slower.
P99_MS = float(os.environ.get("SANDBOX_TEST_HOSTILE_P99_MS", "100"))
# Bounds on the gateway during an attack, above its state before it.
THREADS_ABOVE = 64
FDS_ABOVE = 64
RSS_ABOVE_MIB = 128
# Under the rapid reset gRPC core 1.51 queues the calls it has parsed and
# not yet handed over (no bound of its own) until the connection is cut:
# measured 110-135 MiB above the start on the CI machine.
RSS_ABOVE_RAPID_RESET_MIB = 192


def proc_status(pid: int) -> tuple[int, int]:
    """(threads, VmRSS KiB) of `pid`."""
    threads = rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return threads, rss


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Watch:
    """Samples the gateway's threads, descriptors and VmRSS every 0.1 s."""

    def __init__(self, gw):
        self.gw = gw
        self.threads, self.rss = proc_status(gw.pid)
        self.fds = fds_of(gw.pid)
        self.base = (self.threads, self.fds, self.rss)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.1):
            with contextlib.suppress(OSError, ValueError):
                t, r = proc_status(self.gw.pid)
                self.threads, self.rss = max(self.threads, t), max(self.rss, r)
                self.fds = max(self.fds, fds_of(self.gw.pid))

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def check(self, fds_above: int = FDS_ABOVE, rss_above_mib: int = RSS_ABOVE_MIB):
        t0, f0, r0 = self.base
        assert self.gw.alive(), "the gateway died"
        assert self.threads <= t0 + THREADS_ABOVE, f"threads {t0} -> {self.threads}"
        assert self.fds <= f0 + fds_above, f"descriptors {f0} -> {self.fds}"
        assert self.rss <= r0 + rss_above_mib * 1024, f"VmRSS {r0} -> {self.rss} KiB"


def exec_latencies(sbx, sid: str, seconds: float) -> list[float]:
    """Execs `true` back to back for `seconds`; each one's latency in ms."""
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        res = collect(sbx.exec_call(sid, ["true"], rpc_timeout=30))
        out.append((time.monotonic() - t0) * 1000)
        assert res.code == 0, res.describe()
    return out


def p99(values: list[float]) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * 0.99))]


@contextlib.contextmanager
def attacker(target, *args):
    """Runs `target(*args, queue)` in a spawned process; yields a function
    that waits for its result."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q), daemon=True)
    p.start()
    try:
        yield lambda: q.get(timeout=ATTACK_S + 30)
    finally:
        p.join(ATTACK_S + 30)
        if p.is_alive():
            p.kill()
            p.join()


def under_attack(gw, sbx, sid, start_attack, fds_above: int = FDS_ABOVE, rss_above_mib: int = RSS_ABOVE_MIB):
    """Measures an exec's latency before and during an attack; asserts the
    bounds. Returns the attack's result."""
    exec_latencies(sbx, sid, 1.0)  # warm
    with Watch(gw) as w:
        with start_attack() as result:
            time.sleep(1.0)  # let the attack build up
            lat = exec_latencies(sbx, sid, ATTACK_S - 3.0)
            got = result()
    assert lat, "no exec completed"
    print(f"attack: {got}; exec p99 {p99(lat):.1f} ms over {len(lat)}; gateway (threads, fds, rss KiB) "
          f"{w.base} -> {(w.threads, w.fds, w.rss)}")
    w.check(fds_above, rss_above_mib)
    assert p99(lat) < P99_MS, f"exec p99 {p99(lat):.0f} ms over {len(lat)} execs (max {max(lat):.0f} ms)"
    # And after: the gateway serves as before.
    assert sbx.sh_out(sid, "echo alive") == "alive\n"
    return got


@pytest.fixture
def hostile_gateway(secret):
    with running_gateway({"SANDBOX_MAX": "16"}, secret=secret, check=True) as gw:
        yield gw


def test_rapid_reset_leaves_threads_bounded_and_exec_fast(hostile_gateway):
    gw = hostile_gateway
    with sandbox_client(gw) as sbx:
        sid = sbx.launch().sandbox_id
        sent, conns = under_attack(gw, sbx, sid, lambda: attacker(
            h2raw.rapid_reset, gw.port, "127.0.0.2", ATTACK_S, 12000, "/sandbox.v1.Sandbox/Exec"),
            rss_above_mib=RSS_ABOVE_RAPID_RESET_MIB)
        assert sent > 10000, sent
        # The connection was cut for its resets (the attacker had to reconnect).
        assert conns > 1, conns


def _reflection_request() -> bytes:
    symbol = b"sandbox.v1.Sandbox"
    return b"\x22" + bytes([len(symbol)]) + symbol  # file_containing_symbol


def test_refused_calls_on_a_connection_that_never_reads_hold_no_thread(hostile_gateway):
    gw = hostile_gateway
    with sandbox_client(gw) as sbx:
        sid = sbx.launch().sandbox_id
        conns = under_attack(gw, sbx, sid, lambda: attacker(
            h2raw.refused_flood, gw.port, "127.0.0.3", ATTACK_S, 1500, "/sandbox.v1.Sandbox/Launch",
            _reflection_request()))
        assert conns >= 3, conns


IDLE_CONNECTIONS = 4200


def test_4200_idle_connections_leave_descriptors_for_launch_and_exec(hostile_gateway):
    gw = hostile_gateway
    # The gateway's open files lowered to 4096 once it runs: 4200 connections
    # would take them all; the cap (1024 by default) keeps the rest for
    # sandboxes, calls and streams.
    resource.prlimit(gw.pid, resource.RLIMIT_NOFILE, (4096, 4096))
    own = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (own[1], own[1]))
    try:
        with sandbox_client(gw) as sbx:
            sid = sbx.launch().sandbox_id

            @contextlib.contextmanager
            def idle():
                socks = []
                try:
                    # From 42 addresses, 100 each: past the per-address cap
                    # (64) and the total (1024).
                    for i in range(IDLE_CONNECTIONS):
                        with contextlib.suppress(OSError):
                            socks.append(h2raw.connect(gw.port, f"127.0.1.{10 + i // 100}"))
                    yield lambda: len(socks)
                finally:
                    for s in socks:
                        s.close()

            under_attack(gw, sbx, sid, idle, fds_above=1024 + FDS_ABOVE)
            # Launches and execs still get descriptors with the connections held.
            with idle():
                other = sbx.launch().sandbox_id
                assert sbx.sh_out(other, "echo fine") == "fine\n"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, own)
