"""What a sandbox chooses never costs the gateway unbounded memory.

A listing a sandbox makes huge (thousands of hard links to one symlink with
a 4095-byte target, under a path of nearly 4 KiB) costs the gateway one
page per ListDir call, during and after, however many callers list it at
once; a caller who pages through still gets every entry. Detached
processes' output, running or exited, stays within the documented budget
of SANDBOX_MAX_PROCESSES x 2 x SANDBOX_PROCESS_BUFFER_BYTES per sandbox.
Memory is measured as the gateway's VmRSS."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from tests.integration.test_runtime_processes import background, processes
from tests.lib.client import SandboxClient, new_id, pb
from tests.lib.gateway import running_gateway
from tests.lib.procs import RssSampler, vm_rss_kib, wait_until

MiB = 1 << 20

# The links of the attack: each entry is ~7.9 KB, the listing ~158 MB.
LINKS = 20000
# Made inside the sandbox: a path of ~3.8 KB (15 levels of 250-byte
# names), one symlink with a 4095-byte target, hard links to it.
MAKE_LINKS = f"""
import os
base = "/root/" + "/".join(["d" * 250] * 15)
os.makedirs(base)
os.symlink("t" * 4095, base + "/l0")
for i in range(1, {LINKS}):
    os.link(base + "/l0", base + "/l%d" % i, follow_symlinks=False)
print(base)
"""
# A page is at most 4 MiB of entries; two calls at once, each with its
# page, the copy gRPC sends and its transport's buffers: well under this.
LIST_GROWTH_MIB = 64
# What may stay after the calls (allocator and gRPC caches).
LIST_AFTER_MIB = 24


@pytest.fixture(scope="module")
def links(sbx):
    """(sandbox, the directory holding the links)."""
    sid = sbx.launch().sandbox_id
    r = sbx.py(sid, MAKE_LINKS)
    assert r.code == 0, r.describe()
    yield sid, r.out.strip()
    sbx.delete(sid)


def list_all(sbx, sid, path) -> int:
    """Pages through the listing; the number of entries."""
    n, token = 0, ""
    while True:
        resp = sbx.stub.ListDir(pb.ListDirRequest(sandbox_id=sid, path=path, page_size=100000, page_token=token),
                                metadata=sbx.md, timeout=60)
        n += len(resp.entries)
        if resp.entries:
            e = resp.entries[-1]
            assert e.type == pb.FILE_TYPE_SYMLINK and e.symlink_target == "t" * 4095, e.path
        if not resp.next_page_token:
            return n
        token = resp.next_page_token


def twice_at_once(fn):
    """Runs fn() in two threads at once; their results (or exceptions)."""
    out = [None, None]

    def run(i):
        try:
            out[i] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            out[i] = e

    ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out


def settled_rss_growth_mib(gw, base_kib) -> float:
    time.sleep(1.0)
    return (vm_rss_kib(gw.pid) - base_kib) / 1024.0


def test_a_huge_listing_in_one_answer_is_refused_without_gathering_it(gateway, sbx, links):
    sid, path = links
    base = vm_rss_kib(gateway.pid)

    def one():
        with pytest.raises(grpc.RpcError) as e:
            sbx.stub.ListDir(pb.ListDirRequest(sandbox_id=sid, path=path), metadata=sbx.md, timeout=60)
        return e.value

    with RssSampler(gateway) as rss:
        errors = twice_at_once(one)
    for e in errors:
        assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
        assert "page" in e.details(), e.details()
    assert rss.growth_mib < LIST_GROWTH_MIB, f"gateway VmRSS grew {rss.growth_mib:.0f} MiB during two ListDirs"
    after = settled_rss_growth_mib(gateway, base)
    assert after < LIST_AFTER_MIB, f"gateway VmRSS stayed {after:.0f} MiB above its start"


def test_paging_through_a_huge_listing_costs_one_page_per_call(gateway, sbx, links):
    sid, path = links
    base = vm_rss_kib(gateway.pid)
    with RssSampler(gateway) as rss:
        counts = twice_at_once(lambda: list_all(sbx, sid, path))
    assert counts == [LINKS, LINKS], counts
    assert rss.growth_mib < LIST_GROWTH_MIB, f"gateway VmRSS grew {rss.growth_mib:.0f} MiB during two listings"
    after = settled_rss_growth_mib(gateway, base)
    assert after < LIST_AFTER_MIB, f"gateway VmRSS stayed {after:.0f} MiB above its start"


def test_pages_cover_the_listing_once_in_order(sbx):
    sid = sbx.launch().sandbox_id
    try:
        sbx.ok(sid, "mkdir -p /tmp/pg/sub && cd /tmp/pg && touch a b c d e sub/x sub/y")
        whole = [e.path for e in sbx.list_dir(sid, "/tmp/pg", depth=2)]
        got, token, pages = [], "", 0
        while True:
            resp = sbx.stub.ListDir(pb.ListDirRequest(sandbox_id=sid, path="/tmp/pg", depth=2, page_size=3,
                                                      page_token=token), metadata=sbx.md, timeout=30)
            pages += 1
            assert len(resp.entries) <= 3
            got += [e.path for e in resp.entries]
            token = resp.next_page_token
            if not token:
                break
        assert got == whole and len(whole) == 8 and pages == 3, (got, whole)
        with pytest.raises(grpc.RpcError) as e:
            sbx.stub.ListDir(pb.ListDirRequest(sandbox_id=sid, path="/tmp/pg", page_token="x1"),
                             metadata=sbx.md, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        sbx.delete(sid)


# --- detached processes' buffers ----------------------------------------------------

PROC_MAX = 8
PROC_BUFFER = 4 * MiB
PROC_BUDGET_MIB = PROC_MAX * 2 * PROC_BUFFER / MiB  # 64 MiB
# Beyond the budget: threads, gRPC, a sandbox's bookkeeping.
PROC_MARGIN_MIB = 24
# Each fills both its rings (5 MiB into each 4 MiB one).
FILL = "head -c 5242880 /dev/urandom; head -c 5242880 /dev/urandom >&2"


def test_detached_buffers_running_and_exited_stay_within_the_budget(gateway_secret):
    env = {"SANDBOX_MAX_PROCESSES": str(PROC_MAX), "SANDBOX_PROCESS_RETAIN": "16",
           "SANDBOX_PROCESS_BUFFER_BYTES": str(PROC_BUFFER)}
    with running_gateway(env, secret=gateway_secret, check=True) as gw:
        c = SandboxClient(gw)
        try:
            sid = new_id("rings")
            c.launch(sid)
            base = vm_rss_kib(gw.pid)
            with RssSampler(gw) as rss:
                # 16 that fill both rings and exit (all retained), then 8
                # that fill both and stay running.
                for wave in range(2):
                    for i in range(PROC_MAX):
                        background(c, sid, ["sh", "-c", FILL], process_id=f"x{wave}-{i}")
                    assert wait_until(lambda: not any(p.running for p in processes(c, sid).values()),
                                      timeout=50.0, interval=0.2)
                for i in range(PROC_MAX):
                    background(c, sid, ["sh", "-c", FILL + "; exec sleep 1000"], process_id=f"r{i}")
                full = 2 * (5 * MiB - PROC_BUFFER)  # both rings full, the rest dropped
                assert wait_until(lambda: sum(p.output_dropped_bytes == full for p in processes(c, sid).values()
                                              if p.running) == PROC_MAX, timeout=50.0, interval=0.2)
            procs = processes(c, sid)
            assert len(procs) == 3 * PROC_MAX, sorted(procs)
            # The running ones keep their newest output whole.
            for i in range(PROC_MAX):
                assert procs[f"r{i}"].output_dropped_bytes == 2 * (5 * MiB - PROC_BUFFER), procs[f"r{i}"]
            grew = (vm_rss_kib(gw.pid) - base) / 1024.0
            assert rss.growth_mib < PROC_BUDGET_MIB + PROC_MARGIN_MIB, (
                f"gateway VmRSS grew {rss.growth_mib:.0f} MiB; the budget is {PROC_BUDGET_MIB:.0f} MiB")
            assert grew < PROC_BUDGET_MIB + PROC_MARGIN_MIB, f"{grew:.0f} MiB held"
            # Deleting the sandbox gives it all back.
            c.delete(sid)
            assert wait_until(lambda: vm_rss_kib(gw.pid) - base < PROC_MARGIN_MIB * 1024, timeout=10.0), (
                f"{(vm_rss_kib(gw.pid) - base) / 1024:.0f} MiB stay after the delete")
        finally:
            c.cleanup()
