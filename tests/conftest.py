"""Fixtures and hooks shared by every test directory (the helpers
themselves are in tests/lib)."""

from __future__ import annotations

import secrets

import pytest

from tests.lib.client import sandbox_client


@pytest.fixture(scope="session")
def gateway_secret() -> str:
    return secrets.token_hex(32)


@pytest.fixture(scope="module")
def sbx(gateway):
    """A SandboxClient of the module's `gateway` (each directory's conftest
    says what that gateway is)."""
    with sandbox_client(gateway) as client:
        yield client


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, attach the output of every process the test used: each
    fixture value with `report_sections()` (processes, process groups,
    clients of a gateway), each section once."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seen = set()
        for value in getattr(item, "funcargs", {}).values():
            if not hasattr(value, "report_sections"):
                continue
            for title, text in value.report_sections():
                if (title, text) not in seen:
                    seen.add((title, text))
                    report.sections.append((f"{title} output ({report.when})", text))
