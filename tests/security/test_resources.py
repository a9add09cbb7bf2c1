"""Resource attacks: each one is contained by a limit, reported, and does
not stop another sandbox (the bystander) from working meanwhile or after;
the gateway's own memory stays bounded when a client reads slowly or not
at all."""

from __future__ import annotations

import time

import pytest

from tests.lib.client import SandboxClient
from tests.lib.gateway import cgroup_pids, gateway_client
from tests.lib.procs import vm_rss_kib
from tests.lib.security import Bystander, assert_works_again, assert_works, py, sh

PIDS_MAX = 64
MEMORY_MB = 128
DISK_MB = 64
INODES = DISK_MB * 128


@pytest.fixture(scope="module")
def limited(gateway_secret):
    with gateway_client({"SANDBOX_PIDS_MAX": str(PIDS_MAX), "SANDBOX_MEMORY_MB": str(MEMORY_MB),
                         "SANDBOX_DISK_MB": str(DISK_MB)}, secret=gateway_secret, check_leftovers=True) as client:
        yield client


@pytest.fixture(scope="module")
def bystander(limited):
    return limited.launch().sandbox_id


@pytest.fixture
def victim(limited):
    sid = limited.launch().sandbox_id
    yield sid
    limited.delete(sid)


def test_fork_bomb(limited, victim, bystander):
    # Technique: the classic shell fork bomb, left to run until the exec's
    # timeout.
    with Bystander(limited, bystander):
        res = sh(limited, victim, "bomb() { bomb | bomb & }; bomb; sleep 8", timeout=10)
    assert res.exit.timed_out or res.exit.message, res.describe()
    assert_works_again(limited, victim)
    assert_works(limited, bystander)


def test_thousands_of_background_processes(limited, victim, bystander):
    # Technique: start 2000 background sleepers that outlive the exec.
    with Bystander(limited, bystander):
        sh(limited, victim, "for i in $(seq 2000); do sleep 300 & done 2>/dev/null; true", timeout=60)
        info = limited.get(victim)
    assert info.process_count <= PIDS_MAX, info
    assert len(cgroup_pids(limited.gw, victim)) <= PIDS_MAX
    assert_works(limited, bystander)


def test_memory_bomb(limited, victim, bystander):
    # Technique: allocate and touch 1 GiB.
    with Bystander(limited, bystander):
        res = py(limited, victim, "x = []\nwhile True: x.append(bytearray(16 << 20))", timeout=60)
    assert res.exit.oom_killed and res.exit.signal == 9, res.describe()
    assert_works(limited, victim)


def test_disk_filler(limited, victim, bystander):
    # Technique: write zeros until the disk is full (the upper layer is a
    # tmpfs in host memory: its size is the only bound).
    with Bystander(limited, bystander):
        res = sh(limited, victim, "dd if=/dev/zero of=/root/big bs=1M count=4096 2>&1; df -m / | tail -1", timeout=60)
    assert "No space left on device" in res.out, res.describe()
    assert limited.get(victim).disk_used_bytes <= DISK_MB << 20
    # /dev/shm is a tmpfs of its own: also bounded.
    res = sh(limited, victim, "dd if=/dev/zero of=/dev/shm/big bs=1M count=4096 2>&1; true", timeout=60)
    assert "No space left on device" in res.out or "Killed" in res.out or res.exit.oom_killed, res.describe()
    assert_works(limited, bystander)


def test_inode_exhaustion(limited, victim, bystander):
    # Technique: create empty files until ENOSPC (bounded by the tmpfs's
    # inode cap, disk_mb * 128).
    with Bystander(limited, bystander):
        res = py(limited, victim, r"""
import os, errno
os.makedirs("/root/many", exist_ok=True)
n = 0
try:
    while n < 5_000_000:
        open(f"/root/many/{n}", "w").close()
        n += 1
    print("NO LIMIT", n)
except OSError as e:
    print("stopped", n, errno.errorcode[e.errno])
""", timeout=120)
    assert "stopped" in res.out and "ENOSPC" in res.out, res.describe()
    assert int(res.out.split()[1]) <= INODES, res.describe()
    assert_works(limited, bystander)


def test_fd_exhaustion_in_one_process(limited, victim, bystander):
    # Technique: open /dev/null until EMFILE, hold the descriptors, and see
    # that the bystander still opens files.
    with Bystander(limited, bystander):
        res = py(limited, victim, r"""
import os, errno, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("stopped", len(fds), errno.errorcode[e.errno], hard)
""", timeout=60)
    assert "stopped" in res.out and "EMFILE" in res.out, res.describe()
    assert_works(limited, bystander)


@pytest.mark.finding("F6")
def test_one_sandbox_cannot_hold_most_of_the_hosts_file_table(sbx, box):
    # Technique (computed, not run: running it would starve every
    # unprivileged process on the machine): each process may hold
    # RLIMIT_NOFILE (hard) open files, a sandbox may run SANDBOX_PIDS_MAX
    # processes, and the host's table is fs.file-max; past it every process
    # without CAP_SYS_ADMIN (other sandboxes' commands included) gets ENFILE.
    res = sh(sbx, box, "ulimit -Hn; cat /proc/sys/fs/file-max")
    hard, file_max = (int(x) for x in res.out.split())
    pids_max = 512  # the gateway's default SANDBOX_PIDS_MAX, used by `gateway`
    assert hard * pids_max <= file_max // 4, (
        f"one sandbox can open {hard} x {pids_max} = {hard * pids_max} files; the host's table holds {file_max}")


def _gateway_rss_growth(client: SandboxClient, sid: str, argv, read_every: float, seconds: float) -> tuple[int, int]:
    """Runs `argv`, reads one message every `read_every` seconds (never when
    None) for `seconds`, samples the gateway's VmRSS; cancels the call.
    Returns (growth KiB, messages read)."""
    pid = client.gw.pid
    base = vm_rss_kib(pid)
    peak = base
    call = client.exec_call(sid, argv, timeout_seconds=120, rpc_timeout=120)
    got = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if read_every is not None:
                next(call)
                got += 1
                time.sleep(read_every)
            else:
                time.sleep(0.2)
            peak = max(peak, vm_rss_kib(pid))
    finally:
        call.cancel()
    return peak - base, got


@pytest.mark.parametrize("argv", [["cat", "/dev/zero"], ["yes"]])
def test_output_flood_to_a_slow_reader_keeps_the_gateway_bounded(limited, victim, bystander, argv):
    # Technique: produce output as fast as possible while the client reads
    # one message every 100 ms for 10 s.
    with Bystander(limited, bystander):
        growth, got = _gateway_rss_growth(limited, victim, argv, read_every=0.1, seconds=10)
    assert got > 10
    assert growth < 64 * 1024, f"the gateway grew by {growth} KiB"
    assert_works(limited, victim)


def test_output_never_read_keeps_the_gateway_bounded_and_cancel_kills(limited, victim, bystander):
    # Technique: a pipe that never drains: `yes` with a client that never
    # reads, then cancels.
    with Bystander(limited, bystander):
        growth, _ = _gateway_rss_growth(limited, victim, ["yes"], read_every=None, seconds=6)
    assert growth < 64 * 1024, f"the gateway grew by {growth} KiB"
    # Cancelling the call ends the command: nothing but pid 1 is left.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and limited.get(victim).process_count > 1:
        time.sleep(0.2)
    assert limited.get(victim).process_count == 1
    assert_works(limited, victim)


def test_message_queues_are_not_a_shared_limit_to_exhaust(limited, victim, bystander):
    # Technique: open POSIX message queues until the per-user limit (shared
    # by every uid-0 process on the host) is gone. mq_open is refused.
    code = r"""
import ctypes, ctypes.util
rt = ctypes.CDLL(ctypes.util.find_library("rt") or "librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
opened = 0
for i in range(64):
    fd = rt.mq_open(f"/sgw-q{i}".encode(), 0o100 | 0o2, 0o600, None)
    if fd < 0:
        break
    opened += 1
print(opened, ctypes.get_errno())
"""
    res = py(limited, victim, code)
    opened, errno_ = (int(v) for v in res.out.split())
    assert opened == 0 and errno_ == 1, res.describe()  # EPERM
    assert_works(limited, bystander)
