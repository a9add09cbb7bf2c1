"""Pytest fixtures for the integration tests (see gateway_fixture.py)."""

from __future__ import annotations

import secrets as _secrets

import pytest

from gateway_fixture import Gateway, ManagedProcess, ProcessGroup, start_gateway
from grpc_clients import HealthClient, StdProtos, sandbox_modules


@pytest.fixture(scope="session")
def std_protos() -> StdProtos:
    return StdProtos()


@pytest.fixture(scope="session")
def sandbox_api():
    """(sandbox_pb2, sandbox_pb2_grpc)."""
    return sandbox_modules()


@pytest.fixture(scope="session")
def gateway_secret() -> str:
    return _secrets.token_hex(32)


def _stop_and_check(procs: list[ManagedProcess]) -> None:
    """Stops the processes; a process that died during the test, or did not
    exit 0 on SIGTERM, fails the teardown with its logs."""
    problems = []
    for p in reversed(procs):
        died_early = p.returncode is not None and not p.signalled
        rc = p.stop()
        if p.expected_exit is None:
            continue
        if died_early:
            problems.append(f"process ended during the test (exit {rc})\n{p.describe()}")
        elif rc != p.expected_exit:
            problems.append(f"exit {rc} on SIGTERM, expected {p.expected_exit}\n{p.describe()}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def gateway(gateway_secret) -> Gateway:
    """One gateway (with a secret) shared by the tests of a module. Tests
    must not stop it."""
    gw = start_gateway(secret=gateway_secret)
    try:
        yield gw
    finally:
        _stop_and_check([gw])


@pytest.fixture
def gateways():
    """Factory for gateways private to one test: `gateways.gateway(env=...,
    secret=...)`. All are stopped at teardown and must exit 0 on SIGTERM
    unless the test changes `gw.expected_exit` (None: not checked)."""
    group = ProcessGroup()
    try:
        yield group
    finally:
        _stop_and_check(group.processes)


@pytest.fixture
def health(gateway, std_protos) -> HealthClient:
    return HealthClient(gateway.channel(), std_protos)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, attach the output of every process the test used."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seen = set()
        for value in getattr(item, "funcargs", {}).values():
            if id(value) in seen or not hasattr(value, "report_sections"):
                continue
            seen.add(id(value))
            for title, text in value.report_sections():
                report.sections.append((f"{title} output ({report.when})", text))


# --- sandbox-shim (tests/integration/test_shim_*.py) -----------------------

from gateway_fixture import Shim, start_shim  # noqa: E402


class ShimGroup(ProcessGroup):
    """ProcessGroup that can also start shims: `shims.shim(gw, env=...)`."""

    def shim(self, gateway=None, **kw) -> Shim:
        return self.add(start_shim(gateway, **kw))


@pytest.fixture(scope="module")
def shim(gateway) -> Shim:
    """A shim in front of the module's `gateway` (same secret). Tests must
    not stop it."""
    s = start_shim(gateway)
    try:
        yield s
    finally:
        _stop_and_check([s])


@pytest.fixture
def shims():
    """Factory for shims (and gateways) private to one test; all stopped at
    teardown and must exit 0 on SIGTERM."""
    group = ShimGroup()
    try:
        yield group
    finally:
        _stop_and_check(group.processes)
