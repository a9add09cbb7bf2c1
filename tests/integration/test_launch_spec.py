"""A launch shaped per request: its resources (memory, CPUs, disk,
processes) bounded by the gateway's maxima and applied to its cgroups and
disk, its launch environment beneath every command's own, and its labels
selected on by List. Hostile specs are refused whole, leaving nothing."""

from __future__ import annotations

import queue
from pathlib import Path

import grpc
import pytest

from tests.lib.client import LAUNCH_TIMEOUT_S, new_id, pb
from tests.lib.gateway import gateway_client
from tests.lib.grpc_clients import rpc_error

DEFAULT_MEMORY_MB = 256
MAX_MEMORY_MB = 512
MAX_CPUS = "2"
DEFAULT_DISK_MB = 128
MAX_DISK_MB = 256
DEFAULT_PIDS = 256
MAX_PIDS = 512


@pytest.fixture(scope="module")
def client(gateway_secret):
    env = {
        "SANDBOX_MEMORY_MB": str(DEFAULT_MEMORY_MB), "SANDBOX_MAX_MEMORY_MB": str(MAX_MEMORY_MB),
        "SANDBOX_MAX_CPUS": MAX_CPUS,
        "SANDBOX_DISK_MB": str(DEFAULT_DISK_MB), "SANDBOX_MAX_DISK_MB": str(MAX_DISK_MB),
        "SANDBOX_PIDS_MAX": str(DEFAULT_PIDS), "SANDBOX_MAX_PIDS": str(MAX_PIDS),
        # A pool of sandboxes made with the defaults: a launch asking for
        # other limits may claim one and gets its own limits set on it.
        "SANDBOX_WARM_POOL": "default=2",
    }
    with gateway_client(env, secret=gateway_secret, check_leftovers=True) as c:
        yield c


def launch(client, sid=None, *, resources=None, env=None, labels=None, **kw):
    sid = sid or new_id("spec")
    client.created.append(sid)
    req = pb.LaunchRequest(sandbox_id=sid, resources=resources, env=dict(env or {}), labels=dict(labels or {}), **kw)
    return client.stub.Launch(req, metadata=client.md, timeout=LAUNCH_TIMEOUT_S)


def cgroup_file(client, controller: str, sid: str, name: str) -> str:
    return (Path("/sys/fs/cgroup") / controller / client.gw.cgroup_group / sid / name).read_text().strip()


# --- resources -----------------------------------------------------------------

# Touches every page of `mib` MiB (a bytes literal is written, not just
# reserved), then says so.
ALLOC = "b = b'x' * ({mib} << 20); print('allocated', len(b) >> 20)"


def test_memory_limit_kills_a_small_sandbox_while_a_bigger_neighbour_survives(client):
    small = launch(client, resources=pb.Resources(memory_mb=64)).sandbox_id
    big = launch(client, resources=pb.Resources(memory_mb=256)).sandbox_id
    code = ALLOC.format(mib=128)
    res = client.py(small, code, timeout_seconds=60, rpc_timeout=90)
    assert "allocated" not in res.out, res.describe()
    assert res.code != 0, res.describe()
    assert res.exit.oom_killed or "MemoryError" in res.err, res.describe()
    ok = client.py(big, code, timeout_seconds=60, rpc_timeout=90)
    assert ok.code == 0 and "allocated 128" in ok.out, ok.describe()
    assert cgroup_file(client, "memory", small, "memory.limit_in_bytes") == str(64 << 20)
    assert client.get(small).resources.memory_mb == 64
    assert client.get(big).resources.memory_mb == 256


def test_fractional_cpus_become_the_cgroup_quota(client):
    sid = launch(client, resources=pb.Resources(cpus=0.5)).sandbox_id
    assert cgroup_file(client, "cpu", sid, "cpu.cfs_period_us") == "100000"
    assert cgroup_file(client, "cpu", sid, "cpu.cfs_quota_us") == "50000"
    assert client.get(sid).resources.cpus == pytest.approx(0.5)
    # A command of the sandbox runs in that group.
    tasks = cgroup_file(client, "cpu", sid, "tasks").split()
    assert tasks, "nothing runs in the sandbox's cpu group"


def test_disk_limit_is_enforced_and_shown(client):
    sid = launch(client, resources=pb.Resources(disk_mb=32)).sandbox_id
    info = client.get(sid)
    assert info.resources.disk_mb == 32
    assert 30 << 20 <= info.disk_limit_bytes <= 33 << 20, info
    res = client.sh(sid, "dd if=/dev/zero of=/root/fill bs=1M count=64 2>&1; echo rc=$?")
    assert "No space left" in res.out, res.describe()


def test_pids_limit_is_applied(client):
    sid = launch(client, resources=pb.Resources(pids_max=40)).sandbox_id
    assert cgroup_file(client, "pids", sid, "pids.max") == "40"
    assert client.get(sid).resources.pids_max == 40


def test_get_shows_the_defaults_when_nothing_is_asked(client):
    sid = launch(client).sandbox_id
    r = client.get(sid).resources
    assert (r.memory_mb, r.cpus, r.disk_mb, r.pids_max) == (DEFAULT_MEMORY_MB, 0, DEFAULT_DISK_MB, DEFAULT_PIDS)
    listed = [s for s in client.list() if s.sandbox_id == sid]
    assert listed and listed[0].resources.memory_mb == DEFAULT_MEMORY_MB


@pytest.mark.parametrize("resources, field, maximum", [
    (pb.Resources(memory_mb=MAX_MEMORY_MB + 1), "memory_mb", str(MAX_MEMORY_MB)),
    (pb.Resources(cpus=2.5), "cpus", "2.000"),
    (pb.Resources(disk_mb=MAX_DISK_MB + 1), "disk_mb", str(MAX_DISK_MB)),
    (pb.Resources(pids_max=MAX_PIDS + 1), "pids_max", str(MAX_PIDS)),
    (pb.Resources(memory_mb=4294967295), "memory_mb", str(MAX_MEMORY_MB)),
    (pb.Resources(cpus=float("nan")), "cpus", "4096"),
    (pb.Resources(cpus=-1), "cpus", "4096"),
])
def test_over_the_maximum_is_refused_naming_the_field_and_nothing_is_made(client, resources, field, maximum):
    sid = new_id("over")
    e = rpc_error(launch, client, sid, resources=resources)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert field in e.details() and maximum in e.details(), e.details()
    assert rpc_error(client.get, sid).code() == grpc.StatusCode.NOT_FOUND


def test_launches_at_and_off_the_defaults_get_the_limits_asked_for(client):
    # Both answer with the limits asked for, pooled or not.
    a = launch(client, resources=pb.Resources(memory_mb=DEFAULT_MEMORY_MB))
    b = launch(client, resources=pb.Resources(memory_mb=300))
    assert a.resources.memory_mb == DEFAULT_MEMORY_MB and b.resources.memory_mb == 300
    assert cgroup_file(client, "memory", b.sandbox_id, "memory.limit_in_bytes") == str(300 << 20)
    assert cgroup_file(client, "memory", a.sandbox_id, "memory.limit_in_bytes") == str(DEFAULT_MEMORY_MB << 20)


# --- env -----------------------------------------------------------------------

class RunSession:
    """A Run call that only starts a command and reads it to its end."""

    def __init__(self, client, start: pb.ProcessStart):
        q: queue.Queue = queue.Queue()
        q.put(pb.ProcessInput(start=start))
        self.call = client.stub.Run(iter(q.get, None), metadata=client.md, timeout=60)
        self.q = q

    def output(self) -> str:
        out = b""
        for ev in self.call:
            kind = ev.WhichOneof("event")
            if kind == "stdout":
                out += ev.stdout
            elif kind == "exit":
                self.q.put(None)
                return out.decode()
        raise AssertionError("Run ended without an exit")


def test_launch_env_is_seen_by_exec_and_run_and_a_request_env_wins(client):
    sid = launch(client, env={"GREETING": "from-launch", "OTHER": "kept", "HOME": "/tmp"}).sandbox_id
    assert client.sh_out(sid, 'echo "$GREETING $OTHER $HOME"') == "from-launch kept /tmp\n"
    res = client.sh(sid, 'echo "$GREETING $OTHER"', env={"GREETING": "from-exec"})
    assert res.out == "from-exec kept\n", res.describe()
    # Run (a process over a stream).
    s = RunSession(client, pb.ProcessStart(sandbox_id=sid, argv=["sh", "-c", 'echo "$GREETING $OTHER"']))
    assert s.output() == "from-launch kept\n"
    s = RunSession(client, pb.ProcessStart(sandbox_id=sid, argv=["sh", "-c", 'echo "$GREETING"'],
                                           env={"GREETING": "from-run"}))
    assert s.output() == "from-run\n"
    # The file API runs as the sandbox's owner, unaffected.
    client.write_file(sid, "/root/note", b"written")
    assert client.read_file(sid, "/root/note")[0] == b"written"
    assert client.sh_out(sid, "cat /root/note") == "written"


def test_launch_env_is_seen_by_a_run_on_a_terminal_and_wins_over_its_term_default(client):
    sid = launch(client, env={"GREETING": "from-launch", "TERM": "vt100"}).sandbox_id
    pty = pb.PtySize(rows=24, cols=80)
    s = RunSession(client, pb.ProcessStart(sandbox_id=sid, argv=["sh", "-c", 'echo "$GREETING $TERM"'], pty=pty))
    assert s.output().strip() == "from-launch vt100"
    s = RunSession(client, pb.ProcessStart(sandbox_id=sid, argv=["sh", "-c", 'echo "$GREETING $TERM"'], pty=pty,
                                           env={"TERM": "xterm"}))
    assert s.output().strip() == "from-launch xterm"
    # Without a launch TERM, a terminal's default stays.
    other = launch(client, env={"GREETING": "x"}).sandbox_id
    s = RunSession(client, pb.ProcessStart(sandbox_id=other, argv=["sh", "-c", 'echo "$TERM"'], pty=pty))
    assert s.output().strip() == "xterm-256color"


def test_file_calls_under_a_launch_env_act_as_the_owner_from_root(client):
    # A file call runs no command: the launch env (even HOME, PWD) does not
    # move where a relative path lands, nor whose the file is.
    sid = launch(client, env={"HOME": "/tmp", "PWD": "/tmp", "GREETING": "from-launch"}).sandbox_id
    info = client.write_file(sid, "relative-note", b"written")
    assert info.path == "/root/relative-note" and (info.uid, info.gid) == (0, 0), info
    assert client.read_file(sid, "relative-note")[0] == b"written"
    assert client.stat(sid, "/root/relative-note").size == len(b"written")
    assert client.sh_out(sid, 'cat /root/relative-note; echo " $GREETING"; test ! -e "$HOME/relative-note"') == \
        "written from-launch\n"


def test_a_sandbox_without_launch_env_keeps_the_defaults(client):
    sid = launch(client).sandbox_id
    assert client.sh_out(sid, 'echo "$HOME ${GREETING-unset}"') == "/root unset\n"


@pytest.mark.parametrize("env, what", [
    ({"": "x"}, "variable name"),
    ({"A=B": "x"}, "variable name"),
    ({f"V{i}": "x" for i in range(129)}, "128"),
    ({"N" * 257: "x"}, "256"),
    ({"BIG": "x" * (32 * 1024 + 1)}, "32768"),
    ({f"V{i}": "x" * 30000 for i in range(3)}, "65536"),
])
def test_hostile_launch_env_is_refused(client, env, what):
    sid = new_id("env-bad")
    e = rpc_error(launch, client, sid, env=env)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "env" in e.details() and what in e.details(), e.details()
    assert rpc_error(client.get, sid).code() == grpc.StatusCode.NOT_FOUND


# --- labels --------------------------------------------------------------------

def _selected(client, selector: str, among: set[str]) -> set[str]:
    resp = client.stub.List(pb.ListRequest(label_selector=selector), metadata=client.md, timeout=10)
    return {s.sandbox_id for s in resp.sandboxes} & among


def test_list_selects_by_equality_inequality_and_existence(client):
    web = launch(client, labels={"app": "web", "env": "prod", "example.com/team": "a"}).sandbox_id
    db = launch(client, labels={"app": "db", "env": "dev"}).sandbox_id
    bare = launch(client).sandbox_id
    mine = {web, db, bare}
    assert _selected(client, "app=web", mine) == {web}
    assert _selected(client, "app==db", mine) == {db}
    assert _selected(client, "app!=web", mine) == {db, bare}
    assert _selected(client, "env", mine) == {web, db}
    assert _selected(client, "!env", mine) == {bare}
    assert _selected(client, "app, env != dev", mine) == {web}
    assert _selected(client, "example.com/team=a", mine) == {web}
    assert _selected(client, "", mine) == mine
    info = client.get(web)
    assert dict(info.labels) == {"app": "web", "env": "prod", "example.com/team": "a"}
    listed = [s for s in client.list() if s.sandbox_id == db]
    assert dict(listed[0].labels) == {"app": "db", "env": "dev"}


@pytest.mark.parametrize("labels, what", [
    ({"bad key": "v"}, "bad key"),
    ({"-a": "v"}, "-a"),
    ({"a": "bad value"}, "value"),
    ({"a" * 64: "v"}, "name"),
    ({"a": "v" * 64}, "value"),
    ({"UPPER.com/a": "v"}, "prefix"),
    ({f"k{i}": "v" for i in range(65)}, "64"),
])
def test_hostile_labels_are_refused(client, labels, what):
    sid = new_id("lbl-bad")
    e = rpc_error(launch, client, sid, labels=labels)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "labels" in e.details() and what in e.details(), e.details()
    assert rpc_error(client.get, sid).code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("selector", ["a,,b", "=v", "a=b=c", "env in (a,b)", "a b", "!", "x" * 5000,
                                      ",".join(["a"] * 65)])
def test_malformed_selectors_are_invalid_argument(client, selector):
    e = rpc_error(client.stub.List, pb.ListRequest(label_selector=selector), metadata=client.md, timeout=10)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "selector" in e.details()
