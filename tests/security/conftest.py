"""Fixtures of the security tests (tests/security/).

Every test here runs hostile code inside a sandbox through the real gateway
and asserts that the attack fails. The gateway is started with the
integration tests' fixture (tests/integration/gateway_fixture.py), which
this file puts on sys.path.

A test whose attack currently succeeds is marked `finding("F<n>")`: it
asserts the secure behaviour, so it fails until the gateway is fixed (see
README.md for the list).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

_INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
if str(_INTEGRATION) not in sys.path:
    sys.path.insert(0, str(_INTEGRATION))

from gateway_fixture import Gateway, start_gateway  # noqa: E402
from test_runtime_common import Sandboxes  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "finding(id): the attack succeeds today; the test asserts the fixed behaviour")


@pytest.fixture(scope="session")
def gateway_secret() -> str:
    return secrets.token_hex(32)


def _stop(gw: Gateway) -> None:
    died = gw.returncode is not None and not gw.signalled
    rc = gw.stop()
    leftovers = gw.leftovers() if rc == 0 else []
    assert not died, f"the gateway died during the tests\n{gw.describe()}"
    assert rc == 0, f"the gateway exited {rc} on SIGTERM\n{gw.describe()}"
    assert leftovers == [], leftovers


@pytest.fixture(scope="module")
def gateway(gateway_secret):
    """A gateway with the default limits, shared by one module's tests."""
    gw = start_gateway(secret=gateway_secret)
    try:
        yield gw
    finally:
        _stop(gw)


@pytest.fixture(scope="module")
def sbx(gateway):
    client = Sandboxes(gateway)
    try:
        yield client
    finally:
        client.cleanup()


@pytest.fixture(scope="module")
def box(sbx):
    """One sandbox shared by a module's tests (tests use names of their own)."""
    return sbx.launch().sandbox_id


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, attach the gateway's output."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for value in getattr(item, "funcargs", {}).values():
            gw = getattr(value, "gw", value)
            if isinstance(gw, Gateway):
                report.sections.append((f"gateway output ({report.when})", gw.describe(150)))
                break
