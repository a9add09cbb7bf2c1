"""The warm pool (SANDBOX_WARM_POOL): sandboxes of the default image made
ahead of launches. A launch claims one (its pid 1 was started before the
call), gets the requested id and the limits its launch asks for (set on
the claimed sandbox's groups and disk), and never anything of an earlier
tenant; List and Get never show pooled ones, Status counts
them; the pool refills after a burst, yields to real launches at
SANDBOX_MAX, and SIGTERM leaves nothing of it behind."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import time
from pathlib import Path

import grpc
import pytest

from tests.lib.client import SandboxClient, new_id, pb
from tests.lib.gateway import (POOL_PREFIX, cgroup_pids, gateway_client, gateway_env, gateway_leftovers, holder_pids,
                               leftovers_of, processes_in_group, running_gateway, stop_checked)
from tests.lib.grpc_clients import rpc_error
from tests.lib.procs import require_gateway_binary, run_to_completion

POOL = 4
MEMORY_MB = 192
PIDS_MAX = 300


def status(client):
    return client.stub.Status(pb.StatusRequest(), metadata=client.md, timeout=10)


def wait_pooled(client, n: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while (got := status(client).pooled) != n and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def pooled_dirs(gw) -> list[str]:
    d = Path(gw.state_dir) / "sandboxes"
    return sorted(p.name for p in d.iterdir() if p.name.startswith(POOL_PREFIX))


def start_ticks_s(pid: int) -> float:
    """When process `pid` started, in seconds since boot."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def launched_records(gw, sid: str) -> list[dict]:
    return list(gw.logs.find(lambda r: r.get("message") == "sandbox launched" and r.get("sandbox_id") == sid))


def wait_record(gw, sid: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while not (recs := launched_records(gw, sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recs, f"no launch record of {sid}"
    return recs[-1]


@pytest.fixture(scope="module")
def client(gateway_secret):
    env = {"SANDBOX_WARM_POOL": f"default={POOL}", "SANDBOX_MEMORY_MB": str(MEMORY_MB),
           "SANDBOX_PIDS_MAX": str(PIDS_MAX)}
    with gateway_client(env, secret=gateway_secret, check_leftovers=True) as c:
        yield c


def test_the_pool_fills_and_status_counts_it(client):
    assert wait_pooled(client, POOL) == POOL
    assert len(pooled_dirs(client.gw)) == POOL
    assert status(client).sandboxes == len(client.ids())


def test_a_launch_claims_a_sandbox_whose_pid_1_started_before_the_call(client):
    assert wait_pooled(client, POOL) == POOL
    time.sleep(0.3)  # well past the clock's tick: a pid 1 made by the call starts after call_start
    before = set(pooled_dirs(client.gw))
    call_start = time.clock_gettime(time.CLOCK_BOOTTIME)
    sid = new_id("pool-claim")
    info = client.launch(sid)
    assert info.sandbox_id == sid
    rec = wait_record(client.gw, sid)
    assert rec.get("pooled") is True, rec
    holder = holder_pids(client.gw, sid)[sid]
    assert start_ticks_s(holder) < call_start - 0.1, "the sandbox's pid 1 was started by the call"
    # It was one of the pooled sandboxes, now under its own name.
    assert len(before - set(pooled_dirs(client.gw))) >= 1
    assert (Path(client.gw.state_dir) / "sandboxes" / sid).is_dir()
    # Its pid 1, seen from inside, is that same process (started before the call too).
    inside = client.sh_out(sid, "cut -d' ' -f22 /proc/1/stat")
    assert int(inside) / os.sysconf("SC_CLK_TCK") < call_start - 0.1
    assert client.sh_out(sid, "echo hello").strip() == "hello"
    client.delete(sid)


def test_a_claimed_sandbox_has_the_requested_id_limits_and_egress(client):
    assert wait_pooled(client, POOL) == POOL
    sid = new_id("pool-limits")
    info = client.launch(sid, allow_egress=True)  # this gateway does not permit egress
    assert wait_record(client.gw, sid).get("pooled") is True
    assert info.sandbox_id == sid and not info.allow_egress
    got = client.get(sid)
    assert got.sandbox_id == sid and not got.allow_egress
    group = client.gw.cgroup_group
    mem = Path("/sys/fs/cgroup/memory") / group / sid / "memory.limit_in_bytes"
    if mem.exists():
        assert int(mem.read_text()) == MEMORY_MB * 1024 * 1024
    pids = Path("/sys/fs/cgroup/pids") / group / sid / "pids.max"
    assert pids.read_text().strip() == str(PIDS_MAX)
    # No network but loopback, as any sandbox without egress.
    out = client.sh_out(sid, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
    assert out.split() == ["lo"], out
    # The placeholder name is nowhere in its groups any more (the v1 cpu
    # hierarchy is left out: a sandbox launched without a CPU limit has no
    # group there).
    for root in Path("/sys/fs/cgroup").iterdir():
        g = root / group / sid
        if (root / group).is_dir() and root.name not in ("cpu", "cpu,cpuacct", "cpuacct"):
            assert g.is_dir(), f"no {g}"
    client.delete(sid)


def test_list_and_get_never_show_pooled_sandboxes(client):
    assert wait_pooled(client, POOL) == POOL
    sid = new_id("pool-list")
    client.launch(sid)
    ids = client.ids()
    assert sid in ids
    assert not [i for i in ids if i.startswith(POOL_PREFIX) or "pool-" in i and i != sid and i not in client.created]
    assert status(client).sandboxes == len(ids)
    for name in pooled_dirs(client.gw):
        with pytest.raises(grpc.RpcError) as e:
            client.get(name)
        assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
        with pytest.raises(grpc.RpcError):
            client.exec(name, ["true"])
    client.delete(sid)


def test_fifty_rapid_launches_drain_the_pool_and_it_refills(client):
    assert wait_pooled(client, POOL) == POOL
    ids = [new_id(f"pool-burst{i}") for i in range(50)]
    try:
        for sid in ids:
            client.launch(sid)
        pooled = sum(1 for sid in ids if wait_record(client.gw, sid).get("pooled") is True)
        assert POOL <= pooled <= 50, pooled
        for sid in ids[:5]:
            assert client.sh_out(sid, "echo ok").strip() == "ok"
    finally:
        client.delete_many(ids, ignore_missing=True)
    assert wait_pooled(client, POOL) == POOL, "the pool did not refill"


def test_no_state_crosses_tenants(client):
    assert wait_pooled(client, POOL) == POOL
    first = new_id("pool-tenant-a")
    client.launch(first)
    client.ok(first, "echo secret > /tmp/left-behind; echo secret > /root/left-behind; "
                     "setsid sleep 1000 >/dev/null 2>&1 & (sleep 1001 &); nohup sleep 1002 >/dev/null 2>&1 &")
    client.delete(first)
    # Every later sandbox, from the pool or not, is fresh.
    later = [new_id(f"pool-tenant-b{i}") for i in range(POOL + 2)]
    try:
        for sid in later:
            client.launch(sid)
            out = client.sh_out(sid, "ls /tmp /root; ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
            assert "left-behind" not in out, out
            assert "sleep 100" not in out, out
    finally:
        client.delete_many(later, ignore_missing=True)


def test_sigterm_with_a_pool_leaves_nothing_behind(gateway_secret):
    env = {"SANDBOX_WARM_POOL": "default=3"}
    with running_gateway(env, secret=gateway_secret) as gw:
        c = SandboxClient(gw)
        assert wait_pooled(c, 3) == 3
        c.launch(new_id("pool-term"))
        assert wait_pooled(c, 3) == 3
        procs = processes_in_group(gw.cgroup_group)
        pooled_procs = [pid for name in pooled_dirs(gw) for pid in cgroup_pids(gw, name)]
        assert len(pooled_procs) >= 3, pooled_procs
        stop_checked(gw, check_leftovers=True)
        assert gateway_leftovers(gw) == []
        sandboxes = Path(gw.state_dir) / "sandboxes"
        assert not sandboxes.exists() or list(sandboxes.iterdir()) == []
        for pid in procs:
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        # Its uid block is free again: another gateway on it starts.
        uid_base = gw.env["SANDBOX_UID_BASE"]
    with running_gateway({"SANDBOX_UID_BASE": uid_base, "SANDBOX_UID_SLOTS": gw.env["SANDBOX_UID_SLOTS"]},
                         secret=gateway_secret):
        pass


def empty_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    return buf.getvalue()


def test_at_sandbox_max_the_pool_yields_to_real_launches(gateway_secret):
    env = {"SANDBOX_WARM_POOL": "default=2", "SANDBOX_MAX": "2"}
    with gateway_client(env, secret=gateway_secret, check_leftovers=True) as c:
        assert wait_pooled(c, 2) == 2
        # Restores are never served by the pool: the gateway is full of
        # pooled sandboxes, and each destroys one and proceeds.
        c.restore(new_id("pool-real1"), [empty_tar()])
        assert status(c).pooled <= 1
        c.restore(new_id("pool-real2"), [empty_tar()])
        assert status(c).pooled == 0
        assert status(c).sandboxes == 2
        with pytest.raises(grpc.RpcError) as e:
            c.launch(new_id("pool-over"))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # No room: the pool stays empty until a sandbox goes.
        time.sleep(0.5)
        assert status(c).pooled == 0
        c.delete(c.ids()[0])
        assert wait_pooled(c, 1) == 1
        sid = new_id("pool-after")
        c.launch(sid)
        assert wait_record(c.gw, sid).get("pooled") is True


@pytest.mark.parametrize("value", [
    "8", "default", "default=-1", "default=65", "default=abc", "default=1,default=2",
    "template:py-data=4", "python:3.12=2", "=3",
])
def test_bad_warm_pool_is_refused_at_start_naming_the_variable(value):
    env = gateway_env({"SANDBOX_WARM_POOL": value}, secret="s")
    try:
        result = run_to_completion([require_gateway_binary()], env, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"SANDBOX_WARM_POOL={value!r} was accepted")
    assert result.returncode != 0, result.stderr
    assert "SANDBOX_WARM_POOL" in result.stderr, result.stderr


def test_the_error_says_why(gateway_secret):
    env = gateway_env({"SANDBOX_WARM_POOL": "template:py-data=4"}, secret="s")
    assert "templates" in run_to_completion([require_gateway_binary()], env, timeout=10).stderr
    env = gateway_env({"SANDBOX_WARM_POOL": "default=65"}, secret="s")
    assert "[0, 64]" in run_to_completion([require_gateway_binary()], env, timeout=10).stderr


# --- a claim takes the launch's resources ----------------------------------------

SHAPE_POOL = 3
SHAPE_MEMORY_MB = 128
SHAPE_DISK_MB = 128
SHAPE_PIDS = 256
ALLOC = "b = b'x' * ({mib} << 20); print('allocated', len(b) >> 20)"


@pytest.fixture(scope="module")
def shaping(gateway_secret):
    """A pool made with one set of defaults, and maxima above and below
    them for launches to ask for."""
    env = {"SANDBOX_WARM_POOL": f"default={SHAPE_POOL}",
           "SANDBOX_MEMORY_MB": str(SHAPE_MEMORY_MB), "SANDBOX_MAX_MEMORY_MB": "512",
           "SANDBOX_MAX_CPUS": "2",
           "SANDBOX_DISK_MB": str(SHAPE_DISK_MB), "SANDBOX_MAX_DISK_MB": "256",
           "SANDBOX_PIDS_MAX": str(SHAPE_PIDS), "SANDBOX_MAX_PIDS": "512"}
    with gateway_client(env, secret=gateway_secret, check_leftovers=True) as c:
        yield c


def claim(client, prefix: str, resources) -> str:
    """Launches with `resources` and checks it was a claim: logged as
    pooled, its pid 1 started before the call."""
    assert wait_pooled(client, SHAPE_POOL) == SHAPE_POOL
    time.sleep(0.3)  # past the clock's tick: a pid 1 made by the call starts after call_start
    sid = new_id(prefix)
    client.created.append(sid)
    call_start = time.clock_gettime(time.CLOCK_BOOTTIME)
    client.stub.Launch(pb.LaunchRequest(sandbox_id=sid, resources=resources), metadata=client.md, timeout=60)
    assert wait_record(client.gw, sid).get("pooled") is True, "not served by the pool"
    assert start_ticks_s(holder_pids(client.gw, sid)[sid]) < call_start - 0.1, "its pid 1 was started by the call"
    return sid


def group_file(client, controller: str, sid: str, name: str) -> str:
    return (Path("/sys/fs/cgroup") / controller / client.gw.cgroup_group / sid / name).read_text().strip()


def test_a_claim_with_64_mib_is_oom_killed_past_it_while_a_256_mib_neighbour_survives(shaping):
    small = claim(shaping, "pool-mem64", pb.Resources(memory_mb=64))  # below the pool's 128
    big = claim(shaping, "pool-mem256", pb.Resources(memory_mb=256))  # above it
    assert group_file(shaping, "memory", small, "memory.limit_in_bytes") == str(64 << 20)
    assert group_file(shaping, "memory", big, "memory.limit_in_bytes") == str(256 << 20)
    code = ALLOC.format(mib=128)
    res = shaping.py(small, code, timeout_seconds=60, rpc_timeout=90)
    assert "allocated" not in res.out and res.code != 0, res.describe()
    assert res.exit.oom_killed or "MemoryError" in res.err, res.describe()
    ok = shaping.py(big, code, timeout_seconds=60, rpc_timeout=90)
    assert ok.code == 0 and "allocated 128" in ok.out, ok.describe()
    assert shaping.sh_out(small, "echo alive").strip() == "alive"  # its pid 1 was not the one killed
    assert (shaping.get(small).resources.memory_mb, shaping.get(big).resources.memory_mb) == (64, 256)
    shaping.delete(small)
    shaping.delete(big)
    # Their memory groups become spares for the refill, made with the
    # pool's 128 MiB from a group that had 64 (v1's memsw raised first).
    assert wait_pooled(shaping, SHAPE_POOL) == SHAPE_POOL
    failed = list(shaping.gw.logs.find(lambda r: "make a pooled sandbox" in r.get("message", "")))
    assert failed == [], failed


def test_a_claim_with_half_a_cpu_has_that_quota_and_its_commands_run_under_it(shaping):
    sid = claim(shaping, "pool-cpu", pb.Resources(cpus=0.5))
    assert group_file(shaping, "cpu", sid, "cpu.cfs_period_us") == "100000"
    assert group_file(shaping, "cpu", sid, "cpu.cfs_quota_us") == "50000"
    assert shaping.get(sid).resources.cpus == pytest.approx(0.5)
    res = shaping.sh(sid, "sleep 5 & echo $!; grep -E ':cpu[,:]' /proc/self/cgroup")
    lines = res.out.split()
    assert int(lines[0]) > 0
    # Inside, the group is the root of its cgroup namespace: no host path, no id.
    assert sid not in res.out and shaping.gw.cgroup_group not in res.out, res.out
    tasks = group_file(shaping, "cpu", sid, "tasks").split()
    assert len(tasks) >= 2, tasks  # its pid 1 and the background sleep
    shaping.delete(sid)


def test_a_claim_with_pids_max_40_cannot_fork_past_it(shaping):
    sid = claim(shaping, "pool-pids", pb.Resources(pids_max=40))
    assert group_file(shaping, "pids", sid, "pids.max") == "40"
    res = shaping.sh(sid, "for i in $(seq 60); do sleep 30 & done 2>&1; echo started; "
                          "ls /proc | grep -c '^[0-9]'", timeout_seconds=20, rpc_timeout=60)
    assert "fork" in res.out.lower() or "resource temporarily unavailable" in res.out.lower(), res.describe()
    assert int(group_file(shaping, "pids", sid, "pids.current")) <= 40
    assert shaping.get(sid).resources.pids_max == 40
    shaping.delete(sid)
    raised = claim(shaping, "pool-pids-up", pb.Resources(pids_max=400))
    assert group_file(shaping, "pids", raised, "pids.max") == "400"
    shaping.delete(raised)


def test_a_claim_gets_the_disk_size_it_asks_for(shaping):
    small = claim(shaping, "pool-disk32", pb.Resources(disk_mb=32))
    info = shaping.get(small)
    assert info.resources.disk_mb == 32 and 30 << 20 <= info.disk_limit_bytes <= 33 << 20, info
    res = shaping.sh(small, "dd if=/dev/zero of=/root/fill bs=1M count=64 2>&1; echo rc=$?")
    assert "No space left" in res.out, res.describe()
    big = claim(shaping, "pool-disk200", pb.Resources(disk_mb=200, memory_mb=512))  # its pages are memory
    assert 198 << 20 <= shaping.get(big).disk_limit_bytes <= 201 << 20
    shaping.ok(big, "dd if=/dev/zero of=/root/fill bs=1M count=160 2>&1")
    shaping.delete(small)
    shaping.delete(big)


def test_a_claim_whose_limits_cannot_be_set_fails_and_is_destroyed_not_pooled(shaping):
    """The pooled sandboxes lose their v1 cpu groups (their pid 1 moved out
    first): a claim asking for a CPU limit cannot write its quota. The
    launch fails naming the file, and the sandbox goes entirely."""
    cpu = Path("/sys/fs/cgroup/cpu") / shaping.gw.cgroup_group
    if not cpu.is_dir():
        pytest.skip("no cgroup v1 cpu hierarchy")
    assert wait_pooled(shaping, SHAPE_POOL) == SHAPE_POOL
    names = pooled_dirs(shaping.gw)
    holders = {}
    for name in names:
        (pid,) = cgroup_pids(shaping.gw, name)
        holders[name] = pid
        (Path("/sys/fs/cgroup/cpu") / "cgroup.procs").write_text(str(pid))
        (cpu / name).rmdir()
    sid = new_id("pool-cpu-fails")
    e = rpc_error(shaping.stub.Launch, pb.LaunchRequest(sandbox_id=sid, resources=pb.Resources(cpus=0.5)),
                  metadata=shaping.md, timeout=60)
    assert e.code() == grpc.StatusCode.INTERNAL, e
    assert "cpu.cfs_quota_us" in e.details() and sid in e.details(), e.details()
    assert rpc_error(shaping.get, sid).code() == grpc.StatusCode.NOT_FOUND
    assert sid not in shaping.ids()
    assert leftovers_of(shaping.gw, sid) == []
    gone = [n for n in names if n not in pooled_dirs(shaping.gw)]
    assert len(gone) == 1, (names, pooled_dirs(shaping.gw))
    assert not Path(f"/proc/{holders[gone[0]]}").exists(), "its pid 1 lives on"
    assert leftovers_of(shaping.gw, gone[0]) == []
    # The pool made a fresh one in its place; the others serve launches
    # without a CPU limit (and are then deleted, leaving nothing).
    assert wait_pooled(shaping, SHAPE_POOL) == SHAPE_POOL
    assert gone[0] not in pooled_dirs(shaping.gw)
    for name in names:
        if name == gone[0]:
            continue
        other = new_id("pool-cpu-after")
        shaping.created.append(other)
        shaping.stub.Launch(pb.LaunchRequest(sandbox_id=other), metadata=shaping.md, timeout=60)
        shaping.delete(other)
        assert leftovers_of(shaping.gw, other) == []
