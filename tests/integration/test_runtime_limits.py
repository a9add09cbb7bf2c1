"""Per-sandbox limits (processes, memory, disk) contain hostile commands,
and other sandboxes keep working while one is under attack."""

from __future__ import annotations

import threading

import grpc
import pytest

from tests.lib.client import new_id
from tests.lib.gateway import gateway_client, leftovers_of

PIDS_MAX = 64
MEMORY_MB = 128
DISK_MB = 64


@pytest.fixture(scope="module")
def limited(gateway_secret):
    with gateway_client({"SANDBOX_PIDS_MAX": str(PIDS_MAX), "SANDBOX_MEMORY_MB": str(MEMORY_MB),
                         "SANDBOX_DISK_MB": str(DISK_MB)}, secret=gateway_secret) as client:
        yield client


@pytest.fixture(scope="module")
def bystander(limited):
    """A sandbox that must keep working whatever happens next door."""
    sid = new_id("bystander")
    limited.launch(sid)
    return sid


@pytest.fixture
def victim(limited):
    sid = new_id("victim")
    limited.launch(sid)
    try:
        yield sid
    finally:
        try:
            limited.delete(sid)
        except grpc.RpcError:
            pass


def assert_works(client, sid):
    res = client.sh(sid, "echo ok; ps -e -o pid= | wc -l", timeout_seconds=20, rpc_timeout=30)
    assert res.code == 0 and res.out.startswith("ok\n"), res.describe()


def test_classic_fork_bomb_is_contained_by_the_process_limit(limited, victim, bystander):
    # bash's fork bomb: the command itself returns at once, the bomb goes on
    # in the background up to the sandbox's process limit.
    res = limited.exec(victim, ["bash", "-c", ":(){ :|:& };:"], timeout_seconds=5, rpc_timeout=30)
    assert res.exit is not None
    # While the bomb runs at the limit, another sandbox works normally.
    info = limited.get(victim)
    assert info.process_count <= PIDS_MAX, info
    assert_works(limited, bystander)
    # Delete kills the bomb and leaves nothing.
    limited.delete(victim)
    assert leftovers_of(limited.gw, victim) == []
    assert_works(limited, bystander)
    # The gateway is healthy: a new sandbox launches and runs.
    sid = limited.launch().sandbox_id
    assert_works(limited, sid)
    limited.delete(sid)


def test_fork_bomb_in_the_foreground_is_killed_at_its_timeout(limited, victim, bystander):
    # A bomb that keeps the command alive: the exec ends at its timeout
    # with everything it started killed.
    call = limited.exec_call(victim, ["bash", "-c", "f(){ f | f; }; f"], timeout_seconds=5, rpc_timeout=60)
    done = {}
    t = threading.Thread(target=lambda: done.update(res=list(call)), daemon=True)
    t.start()
    try:
        assert_works(limited, bystander)  # while the bomb runs
    finally:
        t.join(60)
    assert not t.is_alive()
    ex = done["res"][-1].exit
    assert ex.timed_out and ex.exit_code == -1 and ex.signal == 9, ex
    info = limited.get(victim)
    assert info.process_count == 1, f"only the holder should be left: {info}"
    assert_works(limited, victim)


def test_memory_hog_is_oom_killed_and_reported(limited, victim, bystander):
    res = limited.exec(victim, ["python3", "-c", "x = bytearray(512 * 1024 * 1024)"], timeout_seconds=30)
    assert res.code != 0, res.describe()
    assert (res.code, res.exit.signal) == (-1, 9), res.describe()
    assert_works(limited, bystander)
    assert_works(limited, victim)
    assert res.exit.oom_killed, f"oom_killed not set\n{res.describe()}"
    assert "memory" in res.exit.message, res.describe()
    assert not res.exit.pids_limited, res.describe()


def test_oom_kill_of_a_child_is_reported_even_when_the_command_survives(limited, victim):
    res = limited.sh(victim, 'python3 -c "x = bytearray(512 * 1024 * 1024)"; echo rc=$?', timeout_seconds=30)
    assert res.code == 0 and res.out == "rc=137\n", res.describe()
    assert res.exit.oom_killed, f"oom_killed not set\n{res.describe()}"


def test_hitting_the_process_limit_is_reported_in_the_exit_message(limited, victim):
    script = (
        "import os, signal, time\n"
        "pids, err = [], None\n"
        "for i in range(2 * %d):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        err = e; break\n"
        "    if pid == 0:\n"
        "        time.sleep(60); os._exit(0)\n"
        "    pids.append(pid)\n"
        "print(err is not None)\n"
        "for p in pids: os.kill(p, signal.SIGKILL)\n"
        "for p in pids: os.waitpid(p, 0)\n" % PIDS_MAX)
    res = limited.exec(victim, ["python3", "-c", script], timeout_seconds=30)
    assert res.code == 0 and res.out == "True\n", res.describe()
    assert "process limit" in res.exit.message, f"no word of the limit\n{res.describe()}"
    assert res.exit.pids_limited and not res.exit.oom_killed, res.describe()


def test_disk_filler_gets_no_space_left_on_device(limited, victim, bystander):
    res = limited.exec(victim, ["dd", "if=/dev/zero", "of=/root/big", "bs=1M", "count=200"], timeout_seconds=30)
    assert res.code != 0, res.describe()
    assert "No space left on device" in res.err, res.describe()
    info = limited.get(victim)
    assert info.disk_limit_bytes == DISK_MB * 1024 * 1024, info
    assert info.disk_used_bytes <= info.disk_limit_bytes
    assert_works(limited, bystander)
    # Freeing the space makes the sandbox usable again.
    limited.ok(victim, "rm /root/big; echo fine > /root/small; cat /root/small")
