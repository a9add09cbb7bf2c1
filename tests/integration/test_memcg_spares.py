"""Spare memory cgroups (cgroup v1): the gateway keeps a few memory groups
made ahead of launches, and a deleted sandbox's group becomes one. A
sandbox that gets a deleted sandbox's group must get nothing else of it:
no process, no limit event it did not cause, the same limit."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.lib.client import new_id
from tests.lib.gateway import HOLDERS_MEMCG, SPARE_MEMCGS, SPARE_PREFIX, cgroup_pids, gateway_client

MEMORY_MB = 128
MEMORY_ROOT = Path("/sys/fs/cgroup/memory")

pytestmark = pytest.mark.skipif(
    not (MEMORY_ROOT / "memory.limit_in_bytes").exists(),
    reason="spare memory cgroups need a cgroup v1 memory hierarchy")


@pytest.fixture(scope="module")
def client(gateway_secret):
    with gateway_client({"SANDBOX_MEMORY_MB": str(MEMORY_MB)}, secret=gateway_secret,
                        check_leftovers=True) as c:
        yield c


def group_dir(client, name: str) -> Path:
    return MEMORY_ROOT / client.gw.cgroup_group / name


def spares(client) -> list[Path]:
    return [p for p in group_dir(client, "").iterdir() if p.is_dir() and p.name.startswith(SPARE_PREFIX)]


def oom_kills(memcg: Path) -> int:
    for line in (memcg / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def wait_for_spares(client, at_least: int) -> list[Path]:
    deadline = time.monotonic() + 10
    while len(found := spares(client)) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_spares_are_made_ahead_and_hold_no_process(client):
    found = wait_for_spares(client, SPARE_MEMCGS)
    assert SPARE_MEMCGS // 2 <= len(found) <= SPARE_MEMCGS, found
    for p in found:
        assert (p / "cgroup.procs").read_text() == "", p


def test_a_deleted_sandboxs_group_serves_the_next_with_nothing_of_it(client):
    wait_for_spares(client, SPARE_MEMCGS)
    a = new_id("memcg-a")
    client.launch(a)
    a_dir = group_dir(client, a)
    a_ino = a_dir.stat().st_ino
    # The first tenant hits its memory limit and leaves processes behind
    # that try to outlive it (background, new sessions, double forks).
    res = client.exec(a, ["python3", "-c", "x = bytearray(512 * 1024 * 1024)"], timeout_seconds=30)
    assert res.exit.oom_killed, res.describe()
    assert oom_kills(a_dir) >= 1
    client.ok(a, "for i in 1 2 3; do setsid sleep 1000 & done; (sleep 1000 &) ; nohup sleep 1000 >/dev/null 2>&1 &")
    client.delete(a)
    assert not a_dir.exists()

    b = new_id("memcg-b")
    client.launch(b)
    b_dir = group_dir(client, b)
    # The same group (the newest spare is taken first), renamed.
    assert b_dir.stat().st_ino == a_ino, "the deleted sandbox's memory group was not taken as a spare"
    assert oom_kills(b_dir) >= 1  # the kernel's counter keeps its history...
    res = client.exec(b, ["true"])
    assert res.code == 0 and not res.exit.oom_killed, res.describe()  # ...which is not the new tenant's
    # Only the new sandbox's processes, under the same limit (its pid 1
    # lives in the holders' group: a process of its own to see).
    client.ok(b, "setsid sleep 1000 >/dev/null 2>&1 &")
    procs = {int(p) for p in (b_dir / "cgroup.procs").read_text().split()}
    assert procs and procs <= cgroup_pids(client.gw, b), (procs, cgroup_pids(client.gw, b))
    assert int((b_dir / "memory.limit_in_bytes").read_text()) == MEMORY_MB * 1024 * 1024
    res = client.exec(b, ["python3", "-c", "x = bytearray(512 * 1024 * 1024)"], timeout_seconds=30)
    assert res.exit.oom_killed and "memory" in res.exit.message, res.describe()
    res = client.sh(b, "echo ok")
    assert res.out == "ok\n" and not res.exit.oom_killed, res.describe()
    client.delete(b)


def test_spares_stay_bounded_through_churn(client):
    ids = [new_id("churn") for _ in range(SPARE_MEMCGS * 2)]
    for sid in ids:
        client.launch(sid)
    for sid in ids:
        client.delete(sid)
    found = spares(client)
    assert len(found) <= SPARE_MEMCGS, found
    for p in found:
        assert (p / "cgroup.procs").read_text() == "", p
    # Every spare is a directory of the group: none under another name
    # (besides the holders' group, which holds no process now).
    names = {p.name for p in group_dir(client, "").iterdir() if p.is_dir()}
    assert all(n.startswith(SPARE_PREFIX) or n == HOLDERS_MEMCG for n in names), names
    assert (group_dir(client, HOLDERS_MEMCG) / "cgroup.procs").read_text() == ""
    assert os.path.isdir(group_dir(client, ""))
