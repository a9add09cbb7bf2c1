"""The uid block: a gateway's sandboxes run as host ids of exactly its
block, SANDBOX_UID_BASE .. BASE + SANDBOX_UID_SLOTS x SANDBOX_UID_RANGE - 1,
however many launches it serves (freed ranges are reused, the one freed
longest ago first), and two gateways of one host never share ids: a
gateway whose block overlaps one another running gateway claimed refuses
to start, naming the variables. A block that /etc/subuid gives to another
user is warned about at start."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.lib.gateway import (UID_RANGE, Gateway, free_uid_block, gateway_client, gateway_env, holder_pids,
                               running_gateway)
from tests.lib.procs import require_gateway_binary, run_to_completion
from tests.lib.client import sandbox_client

SLOTS = 3


def host_uids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def holder_uid(gw, sid: str) -> int:
    """The host uid of sandbox `sid`'s pid 1, with its uid_map's start."""
    pid = holder_pids(gw, expect=sid)[sid]
    outside = int(Path(f"/proc/{pid}/uid_map").read_text().split()[1])
    uids = host_uids(pid)
    assert set(uids) == {outside}, (uids, outside)
    return outside


def block_env(base: int, slots: int = SLOTS, **extra: str) -> dict:
    return {"SANDBOX_UID_BASE": str(base), "SANDBOX_UID_SLOTS": str(slots), "SANDBOX_MAX": str(slots), **extra}


def test_launches_never_leave_the_block_and_reuse_the_range_freed_longest_ago(gateway_secret):
    """3 x SANDBOX_UID_SLOTS launch/delete cycles (one sandbox kept live
    throughout): every sandbox runs inside the block; each new one gets the
    range freed longest ago."""
    base = free_uid_block(SLOTS)
    with gateway_client(block_env(base), secret=gateway_secret) as sbx:
        gw = sbx.gw
        keep = sbx.launch().sandbox_id
        kept = holder_uid(gw, keep)
        seen = []
        for _ in range(3 * SLOTS):
            sid = sbx.launch().sandbox_id
            uid = holder_uid(gw, sid)
            seen.append(uid)
            assert base <= uid < base + SLOTS * UID_RANGE, (uid, base, seen)
            assert (uid - base) % UID_RANGE == 0 and uid != kept, (uid, kept)
            sbx.delete(sid)
        # Two free ranges, used in turn: never the one just freed.
        assert all(a != b for a, b in zip(seen, seen[1:])), seen
        assert holder_uid(gw, keep) == kept
        sbx.delete(keep)


def refused(env: dict) -> str:
    try:
        result = run_to_completion([require_gateway_binary()], env, timeout=30)
    except Exception as e:  # it started and kept running: the claim is missing
        pytest.fail(f"the gateway did not refuse to start: {e}")
    assert result.returncode != 0, result.stderr
    return result.stderr


def test_a_gateway_whose_block_overlaps_a_running_ones_refuses_to_start(gateway_secret):
    base = free_uid_block(2 * SLOTS)
    with running_gateway(block_env(base), secret=gateway_secret):
        # The same block, and one that only shares its last range.
        for other in (base, base + (SLOTS - 1) * UID_RANGE):
            stderr = refused(gateway_env(block_env(other), secret=gateway_secret))
            assert "SANDBOX_UID_BASE" in stderr and "SANDBOX_UID_SLOTS" in stderr, stderr
            assert "another gateway" in stderr, stderr
    # Gone (here: stopped), its block is free again.
    with running_gateway(block_env(base + (SLOTS - 1) * UID_RANGE), secret=gateway_secret):
        pass


def test_a_claim_left_by_a_killed_gateway_does_not_hold_the_block(gateway_secret):
    base = free_uid_block(SLOTS)
    gw = Gateway(gateway_env(block_env(base), secret=gateway_secret))
    try:
        gw.wait_listening()
        os.kill(gw.pid, signal.SIGKILL)
        gw.proc.wait(10)
        gw.signalled = True
    finally:
        gw.stop()
    with gateway_client(block_env(base), secret=gateway_secret) as sbx:
        sid = sbx.launch().sandbox_id
        assert base <= holder_uid(sbx.gw, sid) < base + SLOTS * UID_RANGE
        sbx.delete(sid)


def test_two_gateways_with_distinct_blocks_run_side_by_side(gateway_secret):
    a_base = free_uid_block(SLOTS)
    with running_gateway(block_env(a_base), secret=gateway_secret) as a:
        b_base = free_uid_block(SLOTS)
        assert abs(a_base - b_base) >= SLOTS * UID_RANGE
        with running_gateway(block_env(b_base), secret=gateway_secret) as b, \
                sandbox_client(a) as ca, sandbox_client(b) as cb:
            sa, sb = ca.launch().sandbox_id, cb.launch().sandbox_id
            ua, ub = holder_uid(a, sa), holder_uid(b, sb)
            assert a_base <= ua < a_base + SLOTS * UID_RANGE, (ua, a_base)
            assert b_base <= ub < b_base + SLOTS * UID_RANGE, (ub, b_base)
            ca.delete(sa)
            cb.delete(sb)


@contextlib.contextmanager
def subuid_line(line: str):
    """/etc/subuid with `line` appended, restored afterwards."""
    path = Path("/etc/subuid")
    before = path.read_bytes() if path.exists() else None
    try:
        text = before.decode() if before else ""
        path.write_text(text + ("" if text.endswith("\n") or not text else "\n") + line + "\n")
        yield
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(before)


def test_a_block_overlapping_another_users_subuid_entry_is_warned_about(gateway_secret):
    base = free_uid_block(SLOTS)
    user = "sgw-test-subuid-user"
    with subuid_line(f"{user}:{base + UID_RANGE}:65536"), subuid_line(f"root:{base}:{SLOTS * UID_RANGE}"), \
            running_gateway(block_env(base), secret=gateway_secret) as gw:
        warnings = [r for r in gw.logs.records() if r.get("file") == "/etc/subuid"]
        # The gateway's own user's reservation is what the docs ask for: no warning.
        assert [r.get("user") for r in warnings] == [user], warnings
        assert "SANDBOX_UID_BASE" in warnings[0].get("message", ""), warnings
        assert warnings[0].get("first") == base + UID_RANGE, warnings
