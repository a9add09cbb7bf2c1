"""Signals and sessions: everything in a sandbox leads sessions of its own,
so `kill(0, …)`, `kill(-1, …)` and job control from inside reach only that
sandbox — never the gateway, the shim, slirp4netns or another sandbox —
and no controlling terminal of the host is reachable."""

from __future__ import annotations

import os

import pytest

from tests.lib.gateway import cgroup_pids
from tests.lib.procs import pid_alive
from tests.lib.security import assert_works, py, sh


def stat_fields(pid: int) -> tuple[int, int]:
    """(process group, session) of a host pid, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    rest = text[text.rindex(")") + 2:].split()
    return int(rest[2]), int(rest[3])


@pytest.fixture
def two(sbx):
    a, b = sbx.launch().sandbox_id, sbx.launch().sandbox_id
    yield a, b
    sbx.delete_many([a, b], ignore_missing=True)


def test_no_sandbox_process_shares_a_group_or_session_with_the_gateway(sbx, gateway, two):
    a, _ = two
    sbx.ok(a, "nohup sleep 300 >/dev/null 2>&1 &")
    gw_group, gw_session = stat_fields(gateway.pid)
    pids = cgroup_pids(gateway, a)
    assert pids, "the sandbox has processes"
    for pid in pids:
        try:
            group, session = stat_fields(pid)
        except OSError:
            continue
        assert group != gw_group and session != gw_session, (pid, group, session, gw_group, gw_session)


def test_a_command_leads_its_own_session_inside(sbx, box):
    # `exec`: the command itself, not a child of the shell.
    res = sh(sbx, box, "exec python3 -c 'import os; print(os.getpid(), os.getpgid(0), os.getsid(0))'")
    pid, group, session = (int(x) for x in res.out.split())
    assert group == pid and session == pid, res.describe()


def test_no_controlling_terminal_is_reachable(sbx, box):
    res = py(sbx, box, """
import errno, os
try:
    os.open("/dev/tty", os.O_RDWR)
    print("opened")
except OSError as e:
    print(errno.errorcode[e.errno])
""")
    assert res.out.strip() == "ENXIO", res.describe()


@pytest.mark.parametrize("attack", ["kill -9 0", "kill -STOP 0", "kill -9 -1", "kill -STOP -1"])
def test_signals_from_inside_reach_only_that_sandbox(sbx, gateway, two, attack):
    a, b = two
    sh(sbx, a, f"{attack}; sleep 1", timeout=3)
    assert pid_alive(gateway.pid)
    assert gateway.proc.poll() is None, "the gateway died"
    with open(f"/proc/{gateway.pid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    assert state != "T", "the gateway was stopped"
    assert_works(sbx, b)
    assert_works(sbx, a)


def test_a_stopped_command_does_not_stop_the_gateway(sbx, gateway, box):
    # A command that stops its own group (job control) is still killed by
    # its timeout; the gateway carries on.
    res = sh(sbx, box, "kill -STOP $$", timeout=2)
    assert res.exit.timed_out, res.describe()
    assert gateway.proc.poll() is None
    assert os.path.exists(f"/proc/{gateway.pid}")
    assert_works(sbx, box)
