"""Fixtures of the reliability tests (tests/reliability/).

These tests abuse the real binaries (sandbox-gateway, sandbox-shim) the way a
broken or hostile client, a crash or a full disk would, and assert that the
system degrades cleanly: clear errors, bounded memory, nothing left behind,
and the service still answering a well-behaved client afterwards.

The binaries are started, and driven, with tests/lib. Every test bounds its
own time; none asserts on timings. Everything runs on loopback.

A test marked `finding("R<n>")` asserts the correct behaviour of something
that is broken today (see README.md): it fails until the bug is fixed.
"""

from __future__ import annotations

import secrets

import pytest

from tests.lib.gateway import Gateway, ProcessGroup, running_gateway
from tests.lib.procs import stop_problems


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "finding(id): broken today (see tests/reliability/README.md); the test asserts the fix")


@pytest.fixture(scope="session")
def secret() -> str:
    return secrets.token_hex(32)


@pytest.fixture(scope="module")
def gateway(secret):
    """A gateway shared by one module's tests (they must not stop it)."""
    with running_gateway(secret=secret, check=True) as gw:
        yield gw


@pytest.fixture
def procs(secret):
    """Gateways and shims private to one test (`procs.gateway(env)` uses
    `secret`), all stopped at teardown."""
    group = ProcessGroup(secret)
    try:
        yield group
    finally:
        problems = stop_problems(*reversed(group.processes))
        for p in group.processes:
            if isinstance(p, Gateway):
                # remove_state ran after stop; double-check nothing is left.
                p.remove_state()
        assert not problems, "\n".join(problems)
