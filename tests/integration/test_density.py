"""Density: thousands of live sandboxes on one machine. Each sandbox's mounts
(its disk included) live only in its own mount namespace, so the host's
mount table — which every launch copies — stays the size it was, and
nothing is left behind; the gateway holds one descriptor per sandbox (its
disk), so its open-file limit is not what caps the count. Timing belongs
to bench/runtime; this checks the behaviour."""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.lib.client import SandboxClient
from tests.lib.gateway import Gateway, gateway_client, gateway_env
from tests.lib.procs import require_gateway_binary, stop_checked

N = 2000


def host_mounts() -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for _ in f)


def memory_cgroups() -> int:
    """The host's memory cgroups, those removed but still held by the
    kernel ("dying") included."""
    with open("/proc/cgroups") as f:
        for line in f:
            fields = line.split()
            if fields[0] == "memory":
                return int(fields[2])
    return 0


def test_two_thousand_live_sandboxes_leave_the_host_mount_table_alone(gateway_secret):
    env = {"SANDBOX_MAX": str(N + 16), "SANDBOX_MEMORY_MB": "64", "SANDBOX_DISK_MB": "16"}
    with gateway_client(env, secret=gateway_secret, check_leftovers=True) as sbx:
        before = host_mounts()
        memcgs_before = memory_cgroups()
        fds_before = len(os.listdir(f"/proc/{sbx.gw.pid}/fd"))
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda _: sbx.launch(timeout=60).sandbox_id, range(N)))
        assert len(set(ids)) == N
        assert host_mounts() - before <= 4, f"{host_mounts() - before} host mounts more with {N} sandboxes"
        fds = len(os.listdir(f"/proc/{sbx.gw.pid}/fd")) - fds_before
        assert fds <= N + 64, f"the gateway holds {fds} more descriptors with {N} sandboxes"
        assert len(sbx.ids()) == N

        def answer(sid: str) -> str:
            return sbx.sh_out(sid, "echo $(hostname) $(cat /proc/self/uid_map | tr -s ' ' | cut -d' ' -f3)")

        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(answer, ids))
        assert all(out.split()[0] == "sandbox" for out in outs), outs[:3]
        assert len({out.split()[1] for out in outs}) == N, "two sandboxes share a uid range"
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(sbx.delete, ids))
        assert sbx.ids() == []
        assert host_mounts() - before <= 4
        # A removed memory cgroup lives on in the kernel while anything is
        # still charged to it: sockets until their network namespace is
        # cleaned up (seconds), page cache until memory pressure reclaims
        # it (never, on an idle machine), each holding its statistics and
        # shrinker slots. The state directory's file-system blocks a launch
        # touches are the host's, not charged to the sandbox, so the count
        # comes back; the first reader of an image file still pins its
        # group, which is why a few are allowed.
        deadline = time.monotonic() + 150
        while memory_cgroups() - memcgs_before > N // 20 and time.monotonic() < deadline:
            time.sleep(2)
        left = memory_cgroups() - memcgs_before
        assert left <= N // 20, f"{left} memory cgroups of deleted sandboxes are still held by the kernel"


def gateway_fds(pid: int) -> list[int]:
    return sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))


def test_sandbox_descriptors_sit_above_those_a_helper_is_started_with(gateway_secret):
    # A helper starts with a copy of the gateway's descriptor table below
    # 2048 only (gateway/runtime/spawn.c): the descriptors the gateway keeps
    # for each sandbox (its disk) sit above, so that copy does not grow with
    # live sandboxes.
    with gateway_client(secret=gateway_secret, check_leftovers=True) as sbx:
        before = [fd for fd in gateway_fds(sbx.gw.pid) if fd >= 2048]
        ids = [f"fds-{i}" for i in range(5)]
        for sid in ids:
            sbx.launch(sid)
        high = [fd for fd in gateway_fds(sbx.gw.pid) if fd >= 2048]
        assert len(high) - len(before) == len(ids), (before, high)
        for sid in ids:
            assert sbx.sh_out(sid, "echo ok") == "ok\n"
        for sid in ids:
            sbx.delete(sid)
        assert [fd for fd in gateway_fds(sbx.gw.pid) if fd >= 2048] == before


def test_a_gateway_under_a_low_open_file_limit_still_serves(gateway_secret):
    # Below 2048 open files the sandboxes' descriptors stay where they are
    # opened (nothing can sit above 2048): launches, execs and exports
    # still work.
    prlimit = shutil.which("prlimit")
    assert prlimit is not None, "prlimit (util-linux) is missing"
    gw = Gateway(gateway_env({"SANDBOX_MAX": "64"}, gateway_secret),
                 args=["--nofile=1024:1024", str(require_gateway_binary())], binary=Path(prlimit))
    try:
        gw.wait_listening()
        limits = Path(f"/proc/{gw.pid}/limits").read_text()
        assert any(line.startswith("Max open files") and line.split()[3:5] == ["1024", "1024"]
                   for line in limits.splitlines()), limits
        sbx = SandboxClient(gw)
        for sid in ("low-a", "low-b", "low-c"):
            sbx.launch(sid)
            res = sbx.sh(sid, "echo hi > /tmp/f && cat /tmp/f")
            assert res.code == 0 and res.out == "hi\n", res.describe()
        assert sbx.export("low-a").received_bytes > 0
        for sid in ("low-a", "low-b", "low-c"):
            sbx.delete(sid)
    finally:
        stop_checked(gw, check_leftovers=True)
