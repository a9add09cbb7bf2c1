"""Faults: the gateway or the shim killed with SIGKILL mid-call, a restart
over what a crash left, a full snapshot disk, a sandbox out of memory, a GCS
outage longer than the retry budget.

A crash must never turn into a fake result (the shim answers 502, not a made
up exit), a half-written snapshot under its real name, or processes, mounts
and cgroups nobody owns once the gateway is back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.lib.client import SandboxClient, collect, pb
from tests.lib.gateway import (SPARE_MEMCGS, SPARE_PREFIX, Gateway, cgroup_pids, commands_in, gateway_leftovers,
                               processes_in_group)
from tests.lib.peers import running_fake_gcs
from tests.lib.procs import START_TIMEOUT_S, vm_rss_kib, wait_until
from tests.lib.shim import health_ok


def sigkill(p) -> None:
    """SIGKILL to the process only (not its group): a crash, not a cleanup."""
    p.signalled = True
    p.expected_exit = None
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGKILL)
    p.proc.wait(10)


def restart(procs, gw: Gateway) -> Gateway:
    """A new gateway over the same state directory, cgroup group and
    snapshot store as `gw` (which must be dead)."""
    assert not gw.alive()
    # The dead gateway's teardown must not remove the new one's state.
    gw._after_stop_callbacks.clear()
    env = dict(gw.env)
    new = Gateway(env)
    procs.add(new)
    new.wait_listening(START_TIMEOUT_S)
    return new


def in_thread(fn):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


# --- the gateway killed mid-call ----------------------------------------------------------

def test_spare_memory_cgroups_a_crash_left_are_removed_by_the_restart(procs):
    memory = Path("/sys/fs/cgroup/memory")
    if not (memory / "memory.limit_in_bytes").exists():
        pytest.skip("spare memory cgroups need a cgroup v1 memory hierarchy")
    gw = procs.gateway()
    group = memory / gw.cgroup_group

    def spares() -> set[int]:
        return {p.stat().st_ino for p in group.iterdir() if p.name.startswith(SPARE_PREFIX)}

    assert wait_until(lambda: len(spares()) >= SPARE_MEMCGS // 2, 15.0), spares()
    before = spares()  # the maker may still be adding to them until the kill
    sigkill(gw)
    old = spares()
    assert before <= old  # nothing removed them: the crash left them
    gw2 = restart(procs, gw)
    assert wait_until(lambda: len(spares()) >= SPARE_MEMCGS // 2, 15.0), spares()
    assert not spares() & old, "the restarted gateway kept the crashed one's spares"
    assert gateway_leftovers(gw2) == []


def test_gateway_killed_during_an_exec_makes_the_shim_answer_502(procs):
    gw = procs.gateway()
    shim = procs.shim(gw)
    r = shim.request("POST", "/sandboxes", {"sandbox_id": "crash-exec"})
    assert r.status == 201, r
    t, box = in_thread(lambda: shim.request("POST", "/sandboxes/crash-exec/exec",
                                            {"argv": ["sh", "-c", "echo started; sleep 300"]}, timeout=60))
    assert wait_until(lambda: commands_in(gw, "crash-exec") != [], 15.0)
    sigkill(gw)
    t.join(60)
    assert "error" not in box, box
    resp = box["value"]
    assert resp.status == 502, resp
    detail = resp.json()["detail"]
    assert "exit_code" not in resp.json() and "Gateway" in detail, resp
    # The shim lives on and says the gateway is gone.
    h = shim.request("GET", "/health", auth=False)
    assert h.status == 200 and h.json()["cli_mounted"] is False, h
    r = shim.request("POST", "/sandboxes/crash-exec/exec", {"argv": ["true"]})
    assert r.status == 502, r
    # A restarted gateway removes what the crash left and serves again.
    gw2 = restart(procs, gw)
    assert gateway_leftovers(gw2) == []
    shim2 = procs.shim(gw2)
    assert shim2.request("GET", "/health", auth=False).json()["cli_mounted"] is True
    assert shim2.request("POST", "/sandboxes", {"sandbox_id": "crash-exec"}).status == 201


def _stream_restore(shim, sid: str, stop: threading.Event):
    """A restore whose body keeps coming (chunked) until `stop`."""
    info = tarfile.TarInfo("root/endless")
    info.size = 1 << 34
    conn = shim.connection(60)
    try:
        conn.putrequest("POST", f"/sandboxes/{sid}/restore")
        conn.putheader("Authorization", f"Bearer {shim.secret}")
        conn.putheader("Content-Type", "application/x-tar")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        first = info.tobuf()
        conn.send(b"%x\r\n%s\r\n" % (len(first), first))
        piece = b"\xa5" * 65536
        with contextlib.suppress(OSError):
            while not stop.is_set():
                conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                time.sleep(0.005)
            conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.finding("R2")
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_gateway_killed_during_a_restore_makes_the_shim_answer_502(procs, attempt):
    """The contract: gateway unreachable → 502. A crash mid-restore answers
    503 most of the time today ("recvmsg:Connection reset by peer" is not
    recognised as unreachable), which the contract reserves for an
    overloaded gateway. (Three attempts: which error text the shim sees
    depends on timing.)"""
    gw = procs.gateway()
    shim = procs.shim(gw)
    stop = threading.Event()
    t, box = in_thread(lambda: _stream_restore(shim, "crash-restore", stop))
    assert wait_until(lambda: Path(f"{gw.state_dir}/sandboxes/crash-restore").exists(), 15.0)
    time.sleep(1.0)
    sigkill(gw)
    time.sleep(1.0)
    stop.set()
    t.join(60)
    assert "error" not in box, box
    status, body = box["value"]
    assert status == 502, (status, body)
    assert health_ok(shim)
    gw2 = restart(procs, gw)
    assert gateway_leftovers(gw2) == []
    assert not Path(f"{gw2.state_dir}/sandboxes/crash-restore").exists()


@pytest.mark.parametrize("previous", [False, True], ids=["first-persist", "overwrite"])
def test_gateway_killed_during_a_persist_leaves_no_partial_snapshot(procs, previous):
    """SIGKILL while PersistSnapshot writes a large snapshot to the local
    store: the real object name holds the previous complete snapshot (or
    nothing); a temporary file may remain, but the restarted gateway never
    serves it (Connect restores the previous snapshot, or creates afresh)."""
    snapdir = tempfile.mkdtemp(prefix="sgw-rel-snap-")
    try:
        gw = procs.gateway({"SANDBOX_SNAPSHOT_DIR": snapdir})
        sbx = SandboxClient(gw)
        sid = "crash-persist"
        sbx.launch(sid)
        v1 = None
        if previous:
            sbx.ok(sid, "echo v1 > /root/marker")
            v1 = list(sbx.stub.PersistSnapshot(pb.PersistSnapshotRequest(sandbox_id=sid),
                                               metadata=sbx.md, timeout=60))[-1]
        real = Path(snapdir) / f"sandbox-snapshots/{sid}.tar"
        sbx.ok(sid, "echo v2 > /root/marker; head -c 600000000 /dev/urandom > /root/big", rpc_timeout=120)
        call = sbx.stub.PersistSnapshot(pb.PersistSnapshotRequest(sandbox_id=sid), metadata=sbx.md, timeout=120)
        t, box = in_thread(lambda: list(call))
        d = real.parent

        def tmp_big():
            with contextlib.suppress(OSError):
                return any(".tmp-" in p.name and p.stat().st_size > 50_000_000 for p in d.iterdir())
            return False

        assert wait_until(tmp_big, 60.0, 0.02), list(d.iterdir()) if d.exists() else "no store dir"
        sigkill(gw)
        t.join(30)
        assert "error" in box and isinstance(box["error"], grpc.RpcError), box
        if previous:
            assert real.is_file()
            assert hashlib.sha256(real.read_bytes()).hexdigest() == v1.sha256, "the real object changed"
        else:
            assert not real.exists(), "a snapshot appeared under the real name"
        gw2 = restart(procs, gw)
        assert gateway_leftovers(gw2) == []
        sbx2 = SandboxClient(gw2)
        r = sbx2.stub.Connect(pb.ConnectRequest(sandbox_id=sid), metadata=sbx2.md, timeout=120)
        sbx2.created.append(sid)
        if previous:
            assert r.outcome == pb.ConnectResponse.OUTCOME_RESTORED
            out = sbx2.ok(sid, "cat /root/marker; ls /root").stdout
            assert out == b"v1\nmarker\n", out
        else:
            assert r.outcome == pb.ConnectResponse.OUTCOME_CREATED, r
            assert sbx2.sh(sid, "ls /root").stdout == b""
        sbx2.cleanup()
    finally:
        subprocess.run(["rm", "-rf", snapdir], check=False)


def test_a_restart_cleans_what_a_crash_left(procs):
    """Sandboxes with background processes, an exec in flight and a
    restored disk; SIGKILL; the leftovers are there; a gateway over the same
    state directory and cgroup group removes every cgroup, process and state
    directory, and starts empty."""
    gw = procs.gateway()
    sbx = SandboxClient(gw)
    sids = [sbx.launch().sandbox_id for _ in range(3)]
    holders = set()
    for sid in sids:
        sbx.ok(sid, "nohup sleep 1000 >/dev/null 2>&1 & echo x > /root/f")
        holders |= cgroup_pids(gw, sid)
    call = sbx.exec_call(sids[0], ["sleep", "500"], rpc_timeout=120)
    t, _ = in_thread(lambda: list(call))
    assert wait_until(lambda: commands_in(gw, sids[0]).count("sleep") == 2, 15.0)
    sigkill(gw)
    t.join(30)
    left = gw.leftovers()
    # The crash did leave something: cgroups (the sandboxes' mounts were in
    # their own mount namespaces, so none is left on the host).
    assert any(x.startswith("cgroup ") for x in left), left
    assert not any(x.startswith("mount ") for x in left), left
    gw2 = restart(procs, gw)
    assert gateway_leftovers(gw2) == []
    assert processes_in_group(gw2.cgroup_group) == []
    alive = [p for p in holders if Path(f"/proc/{p}").exists()
             and "sleep" in Path(f"/proc/{p}/comm").read_text() + Path(f"/proc/{p}/cmdline").read_text()]
    assert alive == [], alive
    assert SandboxClient(gw2).list() == []
    # The ids are free again.
    sbx2 = SandboxClient(gw2)
    for sid in sids:
        sbx2.launch(sid)
    sbx2.cleanup()


# --- the shim killed mid-call -----------------------------------------------------------------

@pytest.mark.parametrize("ndjson", [False, True], ids=["json", "ndjson"])
def test_shim_killed_mid_exec_makes_the_gateway_kill_the_command(procs, ndjson):
    gw = procs.gateway()
    shim = procs.shim(gw)
    sbx = SandboxClient(gw)
    sid = sbx.launch().sandbox_id
    headers = {"Accept": "application/x-ndjson"} if ndjson else {}
    t, box = in_thread(lambda: shim.request("POST", f"/sandboxes/{sid}/exec",
                                            {"argv": ["sleep", "300"]}, headers=headers, timeout=60))
    assert wait_until(lambda: commands_in(gw, sid) == ["sleep"], 15.0), commands_in(gw, sid)
    sigkill(shim)
    t.join(30)
    assert wait_until(lambda: commands_in(gw, sid) == [], 20.0), commands_in(gw, sid)
    assert collect(sbx.exec_call(sid, ["echo", "ok"])).stdout == b"ok\n"
    sbx.cleanup()


# --- a full snapshot disk -----------------------------------------------------------------------

@contextlib.contextmanager
def small_tmpfs(size: str):
    path = tempfile.mkdtemp(prefix="sgw-rel-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "sgw-rel", path], check=True)
    try:
        yield Path(path)
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        with contextlib.suppress(OSError):
            os.rmdir(path)


def test_a_full_snapshot_disk_fails_clearly_and_recovers(procs):
    with small_tmpfs("2m") as snapdir:
        gw = procs.gateway({"SANDBOX_SNAPSHOT_DIR": str(snapdir)})
        shim = procs.shim(gw)
        sbx = SandboxClient(gw)
        sid = sbx.launch().sandbox_id
        sbx.ok(sid, "head -c 10485760 /dev/urandom > /root/blob")
        real = snapdir / f"sandbox-snapshots/{sid}.tar"
        with pytest.raises(grpc.RpcError) as e:
            list(sbx.stub.PersistSnapshot(pb.PersistSnapshotRequest(sandbox_id=sid), metadata=sbx.md, timeout=60))
        code, details = e.value.code(), e.value.details()
        assert code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL), (code, details)
        assert "No space left" in details or "ENOSPC" in details, details
        assert not real.exists()
        assert [p.name for p in real.parent.iterdir()] == [], "the failed write left a temporary file"
        # Through the shim: an error that says why, no made-up success.
        r = shim.request("POST", f"/sandboxes/{sid}/snapshot")
        assert r.status >= 400 and "No space left" in r.json()["detail"], r
        assert not real.exists()
        # The gateway and the sandbox are fine.
        assert sbx.ok(sid, "echo alive").stdout == b"alive\n"
        # Space comes back: the persist works.
        subprocess.run(["mount", "-o", "remount,size=64m", str(snapdir)], check=True)
        done = list(sbx.stub.PersistSnapshot(pb.PersistSnapshotRequest(sandbox_id=sid), metadata=sbx.md,
                                             timeout=60))[-1]
        assert done.done and real.is_file()
        assert hashlib.sha256(real.read_bytes()).hexdigest() == done.sha256
        sbx.cleanup()


# --- a sandbox out of memory -------------------------------------------------------------------

def test_a_sandbox_out_of_memory_is_reported_and_the_gateway_is_fine(procs):
    gw = procs.gateway({"SANDBOX_MEMORY_MB": "32"})
    shim = procs.shim(gw)
    sbx = SandboxClient(gw)
    sid = sbx.launch().sandbox_id
    rss_before = vm_rss_kib(gw.pid)
    res = sbx.exec(sid, ["python3", "-c", "a = bytearray(256 * 1024 * 1024); print(len(a))"])
    assert res.exit.oom_killed, res.describe()
    assert res.exit.signal == signal.SIGKILL, res.describe()
    assert "memory" in res.exit.message, res.describe()
    # Through the shim: a command killed by signal 9 (exit_code -9).
    r = shim.request("POST", f"/sandboxes/{sid}/exec",
                     {"argv": ["python3", "-c", "a = bytearray(256 * 1024 * 1024)"]})
    assert r.status == 200 and r.json()["exit_code"] == -9, r
    assert gw.alive()
    assert (vm_rss_kib(gw.pid) - rss_before) / 1024 < 64
    assert sbx.ok(sid, "echo fine").stdout == b"fine\n"
    other = sbx.launch().sandbox_id
    assert sbx.ok(other, "echo other").stdout == b"other\n"
    sbx.cleanup()


# --- a GCS outage ----------------------------------------------------------------------------------

BUCKET = "reliability-bucket"


@pytest.fixture
def fake_gcs():
    with running_fake_gcs() as g:
        yield g


def gcs_control(gcs, path, body=None):
    return gcs.control(path, body)


def gcs_object(gcs, name):
    return gcs.object_bytes(BUCKET, name)


@pytest.mark.parametrize("fault", [
    {"kind": "status", "code": 503},
    {"kind": "drop", "fraction": 0.5, "commit": False},
    {"kind": "status", "code": 500, "methods": ["PUT"]},
], ids=["503-everything", "dropped-connections", "500-on-chunks"])
def test_a_gcs_outage_longer_than_the_retry_budget_fails_clearly_and_recovers(procs, fake_gcs, fault):
    env = {"CLOUD_RUN_SANDBOX_GCS_BUCKET": BUCKET, "STORAGE_EMULATOR_HOST": fake_gcs.host,
           "SANDBOX_GCS_CHUNK_MB": "1", "SANDBOX_GCS_RETRY_SECONDS": "3"}
    gw = procs.gateway(env)
    sbx = SandboxClient(gw)
    sid = sbx.launch().sandbox_id
    sbx.ok(sid, "head -c 3145728 /dev/urandom > /root/blob")
    name = f"sandbox-snapshots/{sid}.tar"
    gcs_control(fake_gcs, "/_control/fault", dict(fault, count=1000000))
    with pytest.raises(grpc.RpcError) as e:
        list(sbx.stub.PersistSnapshot(pb.PersistSnapshotRequest(sandbox_id=sid), metadata=sbx.md, timeout=120))
    assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                              grpc.StatusCode.DEADLINE_EXCEEDED), e.value
    assert name in e.value.details() or "GCS" in e.value.details() or "gcs" in e.value.details(), \
        e.value.details()
    gcs_control(fake_gcs, "/_control/reset", {})
    with pytest.raises(urllib.error.HTTPError) as h:
        gcs_object(fake_gcs, name)
    assert h.value.code == 404
    # The sandbox is usable, and once the outage ends the persist works.
    assert sbx.ok(sid, "echo alive").stdout == b"alive\n"
    done = list(sbx.stub.PersistSnapshot(pb.PersistSnapshotRequest(sandbox_id=sid), metadata=sbx.md,
                                         timeout=120))[-1]
    assert done.done and done.object_name == name
    assert hashlib.sha256(gcs_object(fake_gcs, name)).hexdigest() == done.sha256
    sbx.cleanup()
