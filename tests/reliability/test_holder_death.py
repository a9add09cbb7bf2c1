"""A sandbox's pid 1 (its holder) is never the one the sandbox's memory
limit kills, however small the sandbox's own processes are. Should it die
anyway (a kill from the host), the gateway notices by itself: the sandbox
is reported dead, with the reason, its processes are killed, and Connect
makes it again."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.lib.client import pb, sandbox_client
from tests.lib.gateway import cgroup_pids, holder_pids
from tests.lib.procs import wait_until

# The attack: processes of a few KiB each (no libc, nothing mapped but a
# page of code and one of stack) that pin the sandbox's memory where no
# process's rss shows it: each writes HOG_MIB MiB into a memfd it keeps
# open (tmpfs pages, charged to the memory cgroup of the writer). Together
# they ask for twice the sandbox's limit, so the limit's OOM killer must
# choose, and every one of them is smaller than the holder (~1 MiB of rss),
# which it chose on cgroup v1 before the holder left the sandbox's memory
# group. The survivors hold on for HOG_HOLD_S, then exit; the parent
# waits for them all.
MEMORY_MB = 64
HOGS = 8
HOG_MIB = MEMORY_MB * 2 // HOGS
HOG_HOLD_S = 2
HOG_C = f"""
static long sc(long n, long a, long b, long c) {{
  long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return r;
}}
static void hog(void) {{
  char page[4096];
  for (int i = 0; i < 4096; i++) page[i] = 1;
  long fd = sc(319 /* memfd_create */, (long) "hog", 0, 0);
  for (long i = 0; fd >= 0 && i < {HOG_MIB} * 256; i++) sc(1 /* write */, fd, (long) page, 4096);
  long hold[2] = {{{HOG_HOLD_S}, 0}};
  sc(35 /* nanosleep */, (long) hold, 0, 0);
  sc(60 /* exit */, 0, 0, 0);
}}
void _start(void) {{
  for (int i = 0; i < {HOGS}; i++)
    if (sc(57 /* fork */, 0, 0, 0) == 0) hog();
  while (sc(61 /* wait4 */, -1, 0, 0) > 0) ;
  sc(60 /* exit */, 0, 0, 0);
}}
"""


@pytest.fixture(scope="module")
def tiny_hog() -> bytes:
    """The attack's program, built on the host (no libc: x86-64 system
    calls)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if platform.machine() != "x86_64" or cc is None:
        pytest.skip("the tiny program is x86-64 and needs a C compiler on the host")
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d, "hog.c"), Path(d, "hog")
        src.write_text(HOG_C)
        subprocess.run([cc, "-nostdlib", "-static", "-Os", "-fno-stack-protector", "-o", str(out), str(src)],
                       check=True, timeout=60)
        return out.read_bytes()


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists(),
                    reason="cgroup v2 places the holder in its sandbox's memory group (docs/runtime.md, Limits)")
def test_the_memory_limit_kills_the_sandboxs_processes_never_its_holder(procs, tiny_hog):
    gw = procs.gateway({"SANDBOX_MEMORY_MB": str(MEMORY_MB)})
    with sandbox_client(gw) as sbx:
        sid = sbx.launch().sandbox_id
        holder = holder_pids(gw, expect=sid)[sid]
        sbx.write_file(sid, "/tmp/hog", tiny_hog, mode=0o755)
        res = sbx.exec(sid, ["/tmp/hog"], timeout_seconds=30)
        # The attack reached the limit: the kernel had to kill.
        assert res.exit.oom_killed, res.describe()
        # It killed the sandbox's processes, not its pid 1 (a pid 1 killed
        # may take a moment to end, and the gateway a tick to notice).
        gone = wait_until(lambda: not running(holder) or sbx.get(sid).dead, 3.0, 0.1)
        assert not gone, f"the holder (pid {holder}) died: {sbx.get(sid)}"
        assert not sbx.get(sid).dead
        assert sbx.sh_out(sid, "echo alive", timeout_seconds=20) == "alive\n"
        sbx.delete(sid)
        assert sid not in sbx.ids()


def test_a_dead_holder_is_reported_and_cleaned_and_connect_restores(procs):
    gw = procs.gateway()
    with sandbox_client(gw) as sbx:
        sid = sbx.launch().sandbox_id
        sbx.ok(sid, "setsid nohup sleep 300 >/dev/null 2>&1 &")
        holder = holder_pids(gw, expect=sid)[sid]
        os.kill(holder, signal.SIGKILL)
        assert wait_until(lambda: sbx.get(sid).dead, 10.0, 0.1), "Get says dead"
        info = sbx.get(sid)
        assert "pid 1" in info.dead_reason, info
        assert [s.dead for s in sbx.list() if s.sandbox_id == sid] == [True]
        # Its processes are gone with it, without a Delete.
        assert wait_until(lambda: not cgroup_pids(gw, sid), 10.0, 0.1), cgroup_pids(gw, sid)
        r = sbx.connect(sid, timeout=60)
        assert r.outcome in (pb.ConnectResponse.OUTCOME_RESTORED, pb.ConnectResponse.OUTCOME_CREATED), r
        assert not sbx.get(sid).dead
        assert sbx.sh_out(sid, "echo back", timeout_seconds=20) == "back\n"
