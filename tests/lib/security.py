"""Helpers of the security tests: running hostile code in a sandbox through
a SandboxClient, and checking that the sandbox survived it."""

from __future__ import annotations

import time
from typing import Optional

from tests.lib.client import ExecResult, SandboxClient


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
