"""Helpers of the security tests: running hostile code in a sandbox through
a SandboxClient, and checking that the sandbox survived it."""

from __future__ import annotations

import time
from typing import Callable, Optional

import grpc

from tests.lib.client import ExecResult, SandboxClient
from tests.lib.procs import Repeater


def py(sbx: SandboxClient, sid: str, code: str, timeout: int = 60, **kw) -> ExecResult:
    """Runs a Python program (given on stdin) in the sandbox."""
    return sbx.py(sid, code, timeout_seconds=timeout, **kw)


def sh(sbx: SandboxClient, sid: str, script: str, timeout: int = 60, **kw) -> ExecResult:
    return sbx.sh(sid, script, timeout_seconds=timeout, **kw)


def assert_works(sbx: SandboxClient, sid: str) -> None:
    """The sandbox still runs commands normally."""
    res = sh(sbx, sid, "echo ok; cat /etc/hostname >/dev/null; ls / >/dev/null", timeout=30)
    assert res.code == 0 and res.out == "ok\n", res.describe()


def assert_works_again(sbx: SandboxClient, sid: str, timeout: float = 10.0) -> None:
    """The sandbox runs commands normally again once what an attack left
    behind has been killed and reaped (its pid 1 reaps them as they die)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert_works(sbx, sid)
            return
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def host_shadow_secret() -> Optional[bytes]:
    """A line of the host's /etc/shadow with a password hash, if any."""
    try:
        with open("/etc/shadow", "rb") as f:
            for line in f:
                parts = line.split(b":")
                if len(parts) > 1 and len(parts[1]) > 4:
                    return parts[1]
    except OSError:
        pass
    return None


class Bystander(Repeater):
    """Another sandbox, used normally while an attack runs: every `interval`
    seconds `check` (when given; it returns a failure's text or None) and
    an Exec of `echo ok` in it. At the end of the `with` block every one
    must have succeeded, and at least one must have run."""

    def __init__(self, client: SandboxClient, sid: str, interval: float = 0.5,
                 check: Optional[Callable[[SandboxClient, str], Optional[str]]] = None):
        super().__init__(interval, join_timeout=60)
        self.client, self.sid, self.check = client, sid, check
        self.failures: list[str] = []
        self.runs = 0

    def step(self) -> None:
        try:
            failure = self.check(self.client, self.sid) if self.check is not None else None
            if failure is not None:
                self.failures.append(failure)
            res = self.client.exec(self.sid, ["sh", "-c", "echo ok"], timeout_seconds=20, rpc_timeout=30)
            if res.out != "ok\n":
                self.failures.append(res.describe())
        except grpc.RpcError as e:
            self.failures.append(f"{e.code()}: {e.details()}")
        self.runs += 1

    def __exit__(self, *exc):
        super().__exit__(*exc)
        assert not self.failures, self.failures[:3]
        assert self.runs > 0
