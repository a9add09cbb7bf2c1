"""Fixtures of the security tests (tests/security/).

Every test here runs hostile code inside a sandbox through the real gateway
and asserts that the attack fails. The gateway is started, and sandboxes
are driven, with tests/lib.

A test whose attack currently succeeds is marked `finding("F<n>")`: it
asserts the secure behaviour, so it fails until the gateway is fixed (see
README.md for the list).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.lib.gateway import running_gateway


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "finding(id): the attack succeeds today; the test asserts the fixed behaviour")


@pytest.fixture(scope="module")
def gateway(gateway_secret):
    """A gateway with the default limits, shared by one module's tests; at
    the end it must exit 0 on SIGTERM and leave nothing behind."""
    with running_gateway(secret=gateway_secret, check_leftovers=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def box(sbx):
    """One sandbox shared by a module's tests (tests use names of their own)."""
    return sbx.launch().sandbox_id


@pytest.fixture
def shared():
    """A host directory any sandbox may write (sticky, as /tmp), for a
    volume; removed after the test."""
    path = Path(f"/tmp/sgw-volume-{secrets.token_hex(6)}")
    path.mkdir()
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def host_canary():
    """A secret the sandbox must never read: a file on a tmpfs the test
    mounts on the host at /tmp/sgw-canary-XXXX. With SANDBOX_ROOTFS=/ the
    host's root filesystem is the sandbox's lower layer, so a plain file in
    /tmp would be visible by design; a separate mount is not (overlayfs does
    not see mounts stacked on its lower directory)."""
    path = Path(f"/tmp/sgw-canary-{secrets.token_hex(6)}")
    path.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "sgw-canary", str(path)], check=True)
    token = "CANARY-" + secrets.token_hex(16)
    try:
        (path / "secret.txt").write_text(token + "\n")
        (path / "secret.txt").chmod(0o600)
        yield path / "secret.txt", token
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


@pytest.fixture
def host_sleep():
    """A host process that a sandbox must not be able to signal."""
    p = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield p
    finally:
        p.kill()
        p.wait(10)

