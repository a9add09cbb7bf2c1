"""Sandbox lifecycle: Launch/Get/List/Delete and their errors, the
sandbox limit, the idle TTL, clean-up after a crash and on SIGTERM."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time

import grpc
import pytest

from tests.lib.client import SandboxClient, new_id
from tests.lib.gateway import Gateway, cgroup_pids, gateway_env, holder_pids, leftovers_of
from tests.lib.procs import pid_alive, require_gateway_binary, run, wait_until


# --- delete ----------------------------------------------------------------------

def test_delete_leaves_nothing_behind(sbx, gateway):
    sid = new_id("del")
    sbx.launch(sid)
    sbx.ok(sid, "head -c 1048576 /dev/urandom > /root/f; nohup sleep 1000 >/dev/null 2>&1 &")
    pids = cgroup_pids(gateway, sid)
    holder = holder_pids(gateway, sid)[sid]
    assert holder in pids and len(pids) >= 2, pids
    assert leftovers_of(gateway, sid), "precondition: the sandbox has mounts and cgroups"
    sbx.delete(sid)
    assert leftovers_of(gateway, sid) == []
    assert [p for p in pids if pid_alive(p)] == [], "processes of the sandbox survive"
    assert sid not in sbx.ids()
    with pytest.raises(grpc.RpcError) as ei:
        sbx.get(sid)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND


def test_delete_during_an_exec_ends_the_exec(sbx, gateway):
    sid = new_id("delx")
    sbx.launch(sid)
    call = sbx.exec_call(sid, ["sh", "-c", "echo started; sleep 1000"], rpc_timeout=60)
    first = next(call)
    assert first.stdout == b"started\n"
    sbx.delete(sid)
    # The exec ends (with the command killed, or an error), it does not hang.
    events, error = [], None
    try:
        for ev in call:
            events.append(ev)
    except grpc.RpcError as e:
        error = e
    if error is None:
        assert events and events[-1].WhichOneof("event") == "exit", events
        assert events[-1].exit.exit_code != 0, events
    assert leftovers_of(gateway, sid) == []


# --- get and list ------------------------------------------------------------------

def test_get_and_list_describe_the_sandbox(sbx):
    sid = new_id("info")
    t0 = int(time.time() * 1000)
    info = sbx.launch(sid)
    t1 = int(time.time() * 1000)
    assert info.sandbox_id == sid
    assert t0 - 1000 <= info.created_at_unix_ms <= t1 + 1000, (t0, info, t1)
    assert info.last_used_unix_ms >= info.created_at_unix_ms
    assert info.process_count == 1, info
    assert info.disk_limit_bytes == 2048 * 1024 * 1024
    assert not info.allow_egress

    got = sbx.get(sid)
    assert (got.sandbox_id, got.created_at_unix_ms) == (sid, info.created_at_unix_ms)
    listed = {s.sandbox_id: s for s in sbx.list()}
    assert sid in listed and listed[sid].created_at_unix_ms == info.created_at_unix_ms

    before = {s.sandbox_id: s for s in sbx.list()}[sid]
    sbx.ok(sid, "nohup sleep 1000 >/dev/null 2>&1 & head -c 10485760 /dev/urandom > /root/ten-mb")
    after = {s.sandbox_id: s for s in sbx.list()}[sid]
    assert after.last_used_unix_ms > before.last_used_unix_ms, (before, after)
    assert after.created_at_unix_ms == before.created_at_unix_ms
    assert after.process_count >= 2, after
    assert after.disk_used_bytes >= before.disk_used_bytes + 10 * 1024 * 1024, (before, after)
    assert after.disk_used_bytes <= after.disk_limit_bytes


def test_list_figures_of_an_unused_sandbox_are_at_most_a_second_old(sbx):
    """List may answer an unused sandbox's process count and disk use from
    its last read, but never older than a second: a detached writer's bytes
    show up without any call to the sandbox."""
    sid = new_id("age")
    sbx.launch(sid)
    sbx.ok(sid, "nohup sh -c 'sleep 1; head -c 8388608 /dev/urandom > /root/late; sleep 1000' >/dev/null 2>&1 &")
    first = {s.sandbox_id: s for s in sbx.list()}[sid]
    deadline = time.time() + 10
    while True:
        time.sleep(0.5)
        now = {s.sandbox_id: s for s in sbx.list()}[sid]
        if now.disk_used_bytes >= first.disk_used_bytes + 8 * 1024 * 1024:
            break
        assert time.time() < deadline, (first, now)
    assert now.last_used_unix_ms == first.last_used_unix_ms  # List is not use
    sbx.delete(sid)


def test_list_is_ordered_by_id(sbx):
    ids = [new_id("ord") for _ in range(3)]
    for sid in ids:
        sbx.launch(sid)
    listed = sbx.ids()
    assert set(ids) <= set(listed)
    assert listed == sorted(listed)


# --- errors --------------------------------------------------------------------------

def test_launching_a_live_id_again_is_already_exists(sbx):
    sid = new_id("dup")
    sbx.launch(sid)
    with pytest.raises(grpc.RpcError) as ei:
        sbx.launch(sid)
    assert ei.value.code() == grpc.StatusCode.ALREADY_EXISTS
    sbx.ok(sid, "true")  # the first one is untouched


@pytest.mark.parametrize("method", ["delete", "get", "exec"])
def test_unknown_sandbox_is_not_found(sbx, method):
    sid = new_id("ghost")
    with pytest.raises(grpc.RpcError) as ei:
        if method == "exec":
            sbx.exec(sid, ["true"])
        else:
            getattr(sbx, method)(sid)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND


BAD_IDS = ["--evil", "../x", "a" * 65, "", "a/b", "a b", "-a", "_a", "a.b", "é"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda s: repr(s[:12]))
@pytest.mark.parametrize("method", ["launch", "delete", "get", "exec"])
def test_invalid_ids_are_invalid_argument(sbx, gateway, method, bad):
    with pytest.raises(grpc.RpcError) as ei:
        if method == "exec":
            sbx.exec(bad, ["true"])
        else:
            getattr(sbx, method)(bad)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
    assert not os.path.exists(os.path.join(gateway.state_dir, "x"))


def test_longest_valid_id_works(sbx):
    sid = "A1_-" + "z" * 60
    assert len(sid) == 64
    sbx.launch(sid)
    assert sbx.ok(sid, "echo hi").out == "hi\n"


def test_launch_beyond_sandbox_max_is_resource_exhausted(gateways, gateway_secret):
    gw = gateways.gateway({"SANDBOX_MAX": "3"}, secret=gateway_secret)
    client = SandboxClient(gw)
    ids = [client.launch().sandbox_id for _ in range(3)]
    with pytest.raises(grpc.RpcError) as ei:
        client.launch()
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert sorted(client.ids()) == sorted(ids)
    client.delete(ids[0])
    client.launch()  # room again
    client.cleanup()
    assert gw.leftovers() == []


# --- idle TTL --------------------------------------------------------------------------

def test_idle_sandbox_is_deleted_and_a_busy_one_is_kept(gateways, gateway_secret):
    gw = gateways.gateway({"SANDBOX_IDLE_TTL": "2"}, secret=gateway_secret)
    client = SandboxClient(gw)
    idle, busy, running = new_id("idle"), new_id("busy"), new_id("running")
    for sid in (idle, busy, running):
        client.launch(sid)
    start = time.monotonic()
    # `running` has one exec lasting longer than the TTL: in use, not idle.
    long_exec = {}
    t = threading.Thread(target=lambda: long_exec.update(r=client.sh(running, "sleep 4; echo done",
                                                                        timeout_seconds=20)))
    t.start()
    try:
        # Keep `busy` in use with short execs; watch with List, which does
        # not count as a use.
        while idle in client.ids():
            assert time.monotonic() - start < 15, "the idle sandbox was not deleted within 15 s"
            client.ok(busy, "true")
            time.sleep(0.3)
        # Go on for at least twice the TTL in all.
        while time.monotonic() - start < 5:
            client.ok(busy, "true")
            time.sleep(0.3)
        assert busy in client.ids()
    finally:
        t.join(30)
    assert long_exec["r"].out == "done\n", long_exec["r"].describe()
    assert leftovers_of(gw, idle) == []
    with pytest.raises(grpc.RpcError) as ei:
        client.get(idle)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    # Left alone, the busy one goes too.
    assert wait_until(lambda: busy not in client.ids(), timeout=15, interval=0.3)
    assert wait_until(lambda: gw.leftovers() == [], timeout=15, interval=0.3), gw.leftovers()


# --- restart and shutdown ---------------------------------------------------------------

def test_restart_after_a_crash_removes_what_the_old_gateway_left(gateways, gateway_secret):
    old = gateways.gateway(secret=gateway_secret)
    old.expected_exit = None  # SIGKILLed below
    client = SandboxClient(old)
    ids = [new_id("crash"), new_id("crash")]
    for sid in ids:
        client.launch(sid)
        client.ok(sid, "nohup sleep 1000 >/dev/null 2>&1 &")
    pids = set().union(*(cgroup_pids(old, sid) for sid in ids))
    assert len(pids) >= 4, pids
    client.channel.close()
    # SIGKILL to the gateway alone: no chance to clean up. (Whether the
    # sandboxes' processes outlive it is the runtime's choice; their cgroups
    # and state directories stay behind either way. Their disks are mounted
    # only in their own mount namespaces: none is left on the host.)
    os.kill(old.pid, signal.SIGKILL)
    old.proc.wait(10)
    old.signalled = True
    left = old.leftovers()
    assert [x for x in left if x.startswith("mount")] == [], left
    assert len([x for x in left if x.startswith("cgroup")]) >= 2, left

    # A new gateway on the same state directory and cgroup group.
    new = Gateway(dict(old.env))
    gateways.add(new)
    new.wait_listening()
    assert new.state_dir == old.state_dir and new.cgroup_group == old.cgroup_group
    assert wait_until(lambda: not [p for p in pids if pid_alive(p)], timeout=10), \
        [p for p in pids if pid_alive(p)]
    assert new.leftovers() == []
    assert os.listdir(os.path.join(new.state_dir, "sandboxes")) == []
    fresh = SandboxClient(new)
    assert fresh.list() == []
    fresh.launch(ids[0])  # the id is free again
    assert fresh.ok(ids[0], "echo back").out == "back\n"
    fresh.cleanup()


def test_sigterm_deletes_every_live_sandbox(gateways, gateway_secret):
    gw = gateways.gateway(secret=gateway_secret)
    client = SandboxClient(gw)
    ids = [client.launch().sandbox_id for _ in range(3)]
    for sid in ids:
        client.ok(sid, "nohup sleep 1000 >/dev/null 2>&1 &")
    pids = set().union(*(cgroup_pids(gw, sid) for sid in ids))
    assert len(pids) >= 6
    client.channel.close()
    gw.send_signal(signal.SIGTERM)
    assert gw.wait(30) == 0, gw.describe()
    # Checked before the fixture's own clean-up runs.
    assert gw.leftovers() == []
    assert os.listdir(os.path.join(gw.state_dir, "sandboxes")) == []
    assert [p for p in pids if pid_alive(p)] == []


def test_delete_reaps_the_holder_when_the_gateway_is_pid_1(gateways, gateway_secret):
    # In a container without an init, the gateway is pid 1: orphans (the
    # sandbox holders, whose launching helper has exited) become its
    # children. Delete must reap them: no zombie left, no warning.
    env = gateway_env(secret=gateway_secret)
    gw = Gateway(env, args=["--pid", "--fork", "--mount-proc", str(require_gateway_binary())],
                 binary=shutil.which("unshare"))
    gateways.add(gw)
    gw.expected_exit = None  # stopped by hand below
    gw.wait_listening()
    inner = int(run(["pgrep", "-P", str(gw.pid)]).stdout.split()[0])  # the gateway itself
    client = SandboxClient(gw)
    try:
        ids = [client.launch().sandbox_id for _ in range(2)]
        client.ok(ids[0], "true")
        client.delete_many(ids)
        children = run(["ps", "--ppid", str(inner), "-o", "pid=,stat=,comm="], check=False).stdout.splitlines()
        zombies = [c for c in children if c.split()[1].startswith("Z")]
        warnings = gw.logs.find(lambda r: r.get("severity") == "WARNING")
        assert zombies == [], f"unreaped children of the gateway: {zombies}"
        assert warnings == [], warnings
    finally:
        client.channel.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(inner, signal.SIGTERM)
        gw.wait(30)
