"""gRPC abuse against sandbox-gateway: oversized messages, a client that
never reads its stream, a thousand concurrent streams, deadlines that are
already gone. The gateway must answer with a clear status, keep its memory
bounded, leave nothing running, and keep serving."""

from __future__ import annotations

import collections
import os
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.lib.client import SandboxClient, collect, pb, pb_grpc
from tests.lib.gateway import commands_in
from tests.lib.procs import RssSampler, wait_until

MIB = 1 << 20


def gateway_serves(sbx: SandboxClient) -> bool:
    try:
        sbx.stub.Status(pb.StatusRequest(), metadata=sbx.md, timeout=10)
        return True
    except grpc.RpcError:
        return False


# --- oversized messages ---------------------------------------------------------------

def _launch_big(sbx, sid):
    return sbx.stub.Launch(pb.LaunchRequest(sandbox_id="a" * (17 * MIB)), metadata=sbx.md, timeout=30)


def _exec_big(sbx, sid):
    return list(sbx.stub.Exec(pb.ExecRequest(sandbox_id=sid, argv=["true"], stdin=b"x" * (17 * MIB)),
                              metadata=sbx.md, timeout=30))


def _exec_big_env(sbx, sid):
    env = {f"V{i}": "e" * 4096 for i in range(17 * 256)}
    return list(sbx.stub.Exec(pb.ExecRequest(sandbox_id=sid, argv=["true"], env=env),
                              metadata=sbx.md, timeout=30))


def _restore_big_header(sbx, sid):
    reqs = iter([pb.RestoreRequest(header=pb.RestoreHeader(sandbox_id="big-" + "h" * (17 * MIB)))])
    return sbx.stub.Restore(reqs, metadata=sbx.md, timeout=30)


def _restore_big_chunk(sbx, sid):
    reqs = iter([pb.RestoreRequest(header=pb.RestoreHeader(sandbox_id="big-restore")),
                 pb.RestoreRequest(tar_chunk=b"\0" * (17 * MIB))])
    return sbx.stub.Restore(reqs, metadata=sbx.md, timeout=30)


@pytest.mark.parametrize("call", [_launch_big, _exec_big, _exec_big_env, _restore_big_header,
                                  _restore_big_chunk],
                         ids=["launch-id", "exec-stdin", "exec-env", "restore-header", "restore-chunk"])
def test_a_17mib_message_is_refused_and_the_gateway_lives_on(gateway, sbx, call):
    sid = sbx.launch().sandbox_id
    with RssSampler(gateway.pid) as rss:
        with pytest.raises(grpc.RpcError) as e:
            call(sbx, sid)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (e.value.code(), e.value.details())
    assert gateway.alive()
    assert gateway_serves(sbx)
    # Nothing came of it: no new sandbox, no command left.
    assert set(sbx.ids()) <= set(sbx.created), sbx.ids()
    assert commands_in(gateway, sid) == []
    assert rss.growth_mib < 128, f"gateway VmRSS grew {rss.growth_mib:.0f} MiB"
    assert collect(sbx.exec_call(sid, ["echo", "ok"])).stdout == b"ok\n"
    sbx.delete(sid)


# --- a client that never reads ----------------------------------------------------------

def test_a_client_that_never_reads_an_exec_stream_costs_bounded_memory(gateway, sbx):
    """Exec of `cat /dev/zero` whose client reads one event and then nothing
    for ~10 s: flow control must hold the command back (gateway VmRSS growth
    < 64 MiB); cancelling the call kills the command."""
    sid = sbx.launch().sandbox_id
    call = sbx.exec_call(sid, ["cat", "/dev/zero"], rpc_timeout=120)
    try:
        with RssSampler(gateway.pid) as rss:
            first = next(call)
            assert first.WhichOneof("event") == "stdout"
            time.sleep(10)
            assert commands_in(gateway, sid) == ["cat"], commands_in(gateway, sid)
        assert rss.growth_mib < 64, f"gateway VmRSS grew {rss.growth_mib:.0f} MiB"
    finally:
        call.cancel()
    assert wait_until(lambda: commands_in(gateway, sid) == [], 15.0), commands_in(gateway, sid)
    assert gateway_serves(sbx)
    sbx.delete(sid)


def test_many_clients_that_never_read_cost_bounded_memory(gateway, sbx):
    """16 such streams at once over 4 sandboxes."""
    sids = [sbx.launch().sandbox_id for _ in range(4)]
    calls = []
    try:
        with RssSampler(gateway.pid) as rss:
            for i in range(16):
                c = sbx.exec_call(sids[i % 4], ["cat", "/dev/zero"], rpc_timeout=120)
                next(c)
                calls.append(c)
            time.sleep(8)
        assert rss.growth_mib < 128, f"gateway VmRSS grew {rss.growth_mib:.0f} MiB"
    finally:
        for c in calls:
            c.cancel()
    for sid in sids:
        assert wait_until(lambda: commands_in(gateway, sid) == [], 15.0), commands_in(gateway, sid)
    sbx.delete_many(sids)


# --- a thousand streams ---------------------------------------------------------------------

def test_1000_concurrent_exec_streams_complete_or_fail_cleanly(gateway, sbx):
    """1000 Exec of `sleep 2` at once over 8 sandboxes and 10 connections:
    each ends with exit 0 or RESOURCE_EXHAUSTED (nothing else), nothing is
    left running, and the gateway serves afterwards with its threads back."""
    sids = [sbx.launch().sandbox_id for _ in range(8)]
    threads_before = len(os.listdir(f"/proc/{gateway.pid}/task"))
    stubs = [pb_grpc.SandboxStub(gateway.channel(options=[("grpc.use_local_subchannel_pool", 1),
                                                          ("sgw.reliability.conn", i)]))
             for i in range(10)]

    def one(i):
        try:
            r = collect(stubs[i % 10].Exec(pb.ExecRequest(sandbox_id=sids[i % 8], argv=["sleep", "2"]),
                                           metadata=sbx.md, timeout=300))
            return ("exit", r.exit.exit_code, r.exit.signal, r.exit.message)
        except grpc.RpcError as e:
            return (e.code().name, e.details()[:120])

    with ThreadPoolExecutor(max_workers=1000) as pool:
        results = list(pool.map(one, range(1000)))
    counts = collections.Counter(results)
    unexpected = {k: v for k, v in counts.items()
                  if k != ("exit", 0, 0, "") and k[0] != "RESOURCE_EXHAUSTED"}
    assert unexpected == {}, counts.most_common(10)
    assert gateway.alive()
    assert gateway_serves(sbx)
    for sid in sids:
        assert wait_until(lambda: commands_in(gateway, sid) == [], 15.0), commands_in(gateway, sid)
    assert wait_until(lambda: len(os.listdir(f"/proc/{gateway.pid}/task")) <= threads_before + 8, 20.0, 0.5), \
        (threads_before, len(os.listdir(f"/proc/{gateway.pid}/task")))
    assert collect(sbx.exec_call(sids[0], ["echo", "after"])).stdout == b"after\n"
    sbx.delete_many(sids)


# --- deadlines ------------------------------------------------------------------------------

@pytest.mark.parametrize("deadline", [0, -1, 0.001, 0.01, 0.05, 0.2, 1.0])
def test_an_exec_past_its_deadline_leaves_nothing_running(gateway, sbx, deadline):
    sid = sbx.launch().sandbox_id
    with pytest.raises(grpc.RpcError) as e:
        list(sbx.exec_call(sid, ["sleep", "300"], rpc_timeout=deadline))
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
    assert wait_until(lambda: commands_in(gateway, sid) == [], 15.0), commands_in(gateway, sid)
    assert collect(sbx.exec_call(sid, ["echo", "ok"])).stdout == b"ok\n"
    sbx.delete(sid)


def _launches_that_timed_out(sbx, deadlines, prefix):
    """Launches one sandbox per deadline; returns (ids whose Launch answered
    DEADLINE_EXCEEDED, ids that launched)."""
    timed_out, launched = [], []
    for i, d in enumerate(deadlines):
        sid = f"{prefix}-{i}-{os.urandom(3).hex()}"
        sbx.list()  # a connected channel: the call is sent, not failed locally
        try:
            sbx.stub.Launch(pb.LaunchRequest(sandbox_id=sid), metadata=sbx.md, timeout=d)
            launched.append(sid)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
            timed_out.append(sid)
    sbx.created += timed_out + launched  # cleanup, whatever happened
    time.sleep(3.0)  # let launches in flight finish
    return timed_out, launched


@pytest.mark.finding("R3")
def test_a_launch_with_an_expired_deadline_creates_nothing(gateway, sbx):
    """Deadline 0 or already past, five times each: every call answers
    DEADLINE_EXCEEDED, and no sandbox may exist afterwards. On a connected
    channel such a call still reaches the gateway, which launches anyway."""
    timed_out, launched = _launches_that_timed_out(sbx, [0, -1] * 5, "expired")
    assert launched == []
    created = [sid for sid in timed_out if sid in sbx.ids()]
    assert created == [], f"Launch answered DEADLINE_EXCEEDED but these exist: {created}"


@pytest.mark.finding("R3")
def test_a_launch_that_fails_deadline_exceeded_leaves_no_sandbox(gateway, sbx):
    """Launches whose deadline (1-10 ms) passes while the gateway works on
    them answer DEADLINE_EXCEEDED; the gateway must then not keep (and count
    against SANDBOX_MAX) a sandbox nobody knows about."""
    timed_out, _ = _launches_that_timed_out(sbx, [0.001, 0.002, 0.005, 0.01] * 3, "late")
    if not timed_out:
        pytest.skip("every launch finished within its deadline")
    created = [sid for sid in timed_out if sid in sbx.ids()]
    assert created == [], f"Launch answered DEADLINE_EXCEEDED but these exist: {created}"


@pytest.mark.parametrize("deadline", [0.001, 0.05])
def test_a_restore_past_its_deadline_leaves_no_sandbox(gateway, sbx, deadline):
    """A Restore whose stream outlives its deadline: DEADLINE_EXCEEDED and no
    (half-restored) sandbox or leftovers."""
    sid = f"rdl-{os.urandom(4).hex()}"

    def reqs():
        yield pb.RestoreRequest(header=pb.RestoreHeader(sandbox_id=sid))
        for _ in range(50):
            time.sleep(0.05)
            yield pb.RestoreRequest(tar_chunk=b"\0" * 512)

    with pytest.raises(grpc.RpcError) as e:
        sbx.stub.Restore(reqs(), metadata=sbx.md, timeout=deadline)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
    assert wait_until(lambda: sid not in sbx.ids(), 15.0, 0.2)
    assert wait_until(lambda: not [x for x in gateway.leftovers() if x.endswith("/" + sid) or f"/{sid}/" in x],
                15.0, 0.2), gateway.leftovers()
