"""Helpers of the security tests (no tests here)."""

from __future__ import annotations

import io
import tarfile
import time
from typing import Optional

from test_runtime_common import ExecResult, Sandboxes


def py(sbx: Sandboxes, sid: str, code: str, timeout: int = 60, **kw) -> ExecResult:
    """Runs a Python program (given on stdin) in the sandbox."""
    return sbx.exec(sid, ["python3", "-"], stdin=code.encode(), timeout_seconds=timeout, **kw)


def sh(sbx: Sandboxes, sid: str, script: str, timeout: int = 60, **kw) -> ExecResult:
    return sbx.exec(sid, ["sh", "-c", script], timeout_seconds=timeout, **kw)


def assert_works(sbx: Sandboxes, sid: str) -> None:
    """The sandbox still runs commands normally."""
    res = sbx.exec(sid, ["sh", "-c", "echo ok; cat /etc/hostname >/dev/null; ls / >/dev/null"],
                   timeout_seconds=30)
    assert res.code == 0 and res.out == "ok\n", res.describe()


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def tar_members(data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
        for m in t.getmembers():
            content = b""
            if m.isfile():
                f = t.extractfile(m)
                content = f.read() if f is not None else b""
            out.append((m, content))
    return out


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


def wait_for(predicate, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
