"""Fixtures of the reliability tests (tests/reliability/).

These tests abuse the real binaries (sandbox-gateway, sandbox-shim) the way a
broken or hostile client, a crash or a full disk would, and assert that the
system degrades cleanly: clear errors, bounded memory, nothing left behind,
and the service still answering a well-behaved client afterwards.

The binaries are started with the integration tests' fixture
(tests/integration/gateway_fixture.py), which this file puts on sys.path.
Every test bounds its own time; none asserts on timings. Everything runs on
loopback.

A test marked `finding("R<n>")` asserts the correct behaviour of something
that is broken today (see README.md): it fails until the bug is fixed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

_INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
if str(_INTEGRATION) not in sys.path:
    sys.path.insert(0, str(_INTEGRATION))

from gateway_fixture import (  # noqa: E402
    Gateway,
    ManagedProcess,
    Shim,
    start_gateway,
    start_shim,
    wait_until,
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "finding(id): broken today (see tests/reliability/README.md); the test asserts the fix")


@pytest.fixture(scope="session")
def secret() -> str:
    return secrets.token_hex(32)


# --- process helpers -------------------------------------------------------------

def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class RssPeak:
    """Samples a process's VmRSS in a background thread; `peak` (KiB)."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid = pid
        self.interval = interval
        self.start = vm_rss_kib(pid)
        self.peak = self.start
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.peak = max(self.peak, vm_rss_kib(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(5)
        with contextlib.suppress(Exception):
            self.peak = max(self.peak, vm_rss_kib(self.pid))
        return False

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.start) / 1024.0


def stop_checked(*procs: ManagedProcess) -> list[str]:
    """Stops processes (SIGTERM); returns problems (died during the test, bad
    exit) instead of raising, so teardown can stop everything first."""
    problems = []
    for p in procs:
        died = p.returncode is not None and not p.signalled
        rc = p.stop()
        if died:
            problems.append(f"{p.name} died during the test (exit {rc})\n{p.describe(80)}")
        elif p.expected_exit is not None and rc != p.expected_exit:
            problems.append(f"{p.name} exited {rc} on SIGTERM\n{p.describe(80)}")
    return problems


def gateway_leftovers(gw: Gateway) -> list[str]:
    """Mounts below the state dir, cgroups of the group, and processes whose
    cgroup is in the group."""
    found = gw.leftovers()
    found += [f"process {pid}" for pid in processes_in_group(gw.cgroup_group)]
    return found


def processes_in_group(group: Optional[str]) -> list[int]:
    if not group:
        return []
    pids: set[int] = set()
    for root in Path("/sys/fs/cgroup").iterdir():
        g = root / group
        if g.is_dir():
            for procs in g.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
    return sorted(pids)


# --- raw HTTP helpers ------------------------------------------------------------

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


class HealthProbe:
    """A normal client polling /health during an abuse; every probe must
    answer 200. `failures` lists what went wrong."""

    def __init__(self, shim: Shim, interval: float = 0.5, timeout: float = 10.0):
        self.shim = shim
        self.interval = interval
        self.timeout = timeout
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                r = self.shim.request("GET", "/health", auth=False, timeout=self.timeout)
                if r.status == 200:
                    self.ok += 1
                else:
                    self.failures.append(f"HTTP {r.status} {r.body[:200]!r}")
            except OSError as e:
                self.failures.append(f"{type(e).__name__}: {e}")
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(self.timeout + 5)
        return False


# --- fixtures ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway(secret):
    """A gateway shared by one module's tests (they must not stop it)."""
    gw = start_gateway(secret=secret)
    try:
        yield gw
    finally:
        problems = stop_checked(gw)
        assert not problems, "\n".join(problems)


class Procs:
    """Gateways and shims private to one test, all stopped at teardown."""

    def __init__(self, secret: str):
        self.secret = secret
        self.procs: list[ManagedProcess] = []

    def gateway(self, env=None, **kw) -> Gateway:
        gw = start_gateway(env, secret=self.secret, **kw)
        self.procs.append(gw)
        return gw

    def shim(self, gw: Optional[Gateway] = None, **kw) -> Shim:
        s = start_shim(gw, **kw)
        self.procs.append(s)
        return s

    def add(self, p: ManagedProcess) -> ManagedProcess:
        self.procs.append(p)
        return p

    def report_sections(self):
        return [(f"{p.name} #{i + 1}", p.describe(150)) for i, p in enumerate(self.procs)]


@pytest.fixture
def procs(secret):
    group = Procs(secret)
    try:
        yield group
    finally:
        problems = stop_checked(*reversed(group.procs))
        for p in group.procs:
            if isinstance(p, Gateway):
                # remove_state ran after stop; double-check nothing is left.
                p.remove_state()
        assert not problems, "\n".join(problems)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, attach the output of the processes the test used."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seen = set()
        for value in getattr(item, "funcargs", {}).values():
            if id(value) in seen:
                continue
            seen.add(id(value))
            if hasattr(value, "report_sections"):
                for title, text in value.report_sections():
                    report.sections.append((f"{title} output ({report.when})", text))
            elif isinstance(value, ManagedProcess):
                report.sections.append((f"{value.name} output ({report.when})", value.describe(150)))


def poll(predicate: Callable[[], object], timeout: float, interval: float = 0.1):
    return wait_until(predicate, timeout, interval)
