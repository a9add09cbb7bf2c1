"""Fixtures of the integration tests (the helpers are in tests/lib)."""

from __future__ import annotations

import pytest

from tests.lib.client import sandbox_client
from tests.lib.gateway import Gateway, ProcessGroup, running_gateway
from tests.lib.grpc_clients import HealthClient, StdProtos, sandbox_modules
from tests.lib.shim import Shim, ShimClient, running_shim


@pytest.fixture(scope="session")
def std_protos() -> StdProtos:
    return StdProtos()


@pytest.fixture(scope="session")
def sandbox_api():
    """(sandbox_pb2, sandbox_pb2_grpc)."""
    return sandbox_modules()


@pytest.fixture(scope="module")
def gateway(gateway_secret) -> Gateway:
    """One gateway (with a secret) shared by the tests of a module. Tests
    must not stop it; one that died, or did not exit 0 on SIGTERM, fails the
    teardown with its logs."""
    with running_gateway(secret=gateway_secret, check=True) as gw:
        yield gw


@pytest.fixture(scope="module")
def gw(gateway):
    """The module's `gateway`, under the name the snapshot tests use."""
    return gateway


@pytest.fixture
def snap(gw):
    """A SandboxClient of `gw` for one test; its sandboxes are deleted at
    teardown."""
    with sandbox_client(gw) as c:
        yield c


@pytest.fixture
def gateways():
    """Factory for gateways (and shims) private to one test:
    `gateways.gateway(env=..., secret=...)`. All are stopped at teardown and
    must exit 0 on SIGTERM unless the test changes `gw.expected_exit` (None:
    not checked)."""
    group = ProcessGroup()
    try:
        yield group
    finally:
        group.stop_checked()


@pytest.fixture
def health(gateway, std_protos) -> HealthClient:
    return HealthClient(gateway.channel(), std_protos)


# --- sandbox-shim (tests/integration/test_shim_*.py) -----------------------

@pytest.fixture(scope="module")
def shim(gateway) -> Shim:
    """A shim in front of the module's `gateway` (same secret). Tests must
    not stop it."""
    with running_shim(gateway, check=True) as s:
        yield s


@pytest.fixture
def shims(gateways):
    """Factory for shims (and gateways) private to one test: `shims.shim(gw,
    env=...)`, `shims.gateway(...)`; all stopped at teardown and must exit 0
    on SIGTERM."""
    return gateways


@pytest.fixture
def client(shim):
    """A ShimClient of the module's `shim`; its sandboxes are deleted at
    teardown."""
    c = ShimClient(shim)
    try:
        yield c
    finally:
        c.cleanup()
