"""The kernel's attack surface from inside a sandbox: system calls the
seccomp filter must deny, namespaces the sandbox must not leave, and
signals that must not reach pid 1, other sandboxes or the host.

System calls are made with ctypes (`libc.syscall(NR, ...)`) so that the
test sees the raw errno, whatever the tools inside would print."""

from __future__ import annotations

import errno
import os
import platform

import pytest

from tests.lib.gateway import holder_pids
from tests.lib.procs import pid_alive
from tests.lib.security import assert_works, py, sh

if platform.machine() != "x86_64":
    pytest.skip("system call numbers below are x86_64's", allow_module_level=True)

# name: (number, args). Arguments that would be harmful if the call went
# through are chosen so that it fails early anyway where possible; what
# matters is that seccomp answers first (EPERM, or ENOSYS for clone3).
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
SYSCALLS = {
    # tracing other processes: pid 1 is the holder, with every capability
    "ptrace_attach_pid1": (101, [16, 1, 0, 0]),
    "ptrace_traceme": (101, [0, 0, 0, 0]),
    "process_vm_readv_pid1": (310, [1, 0, 0, 0, 0, 0]),
    "process_vm_writev_pid1": (311, [1, 0, 0, 0, 0, 0]),
    "kcmp": (312, [1, 1, 0, 0, 0]),
    # kernel programs, observation, keys
    "bpf_prog_load": (321, [5, 0, 0]),
    "perf_event_open": (298, [0, 0, -1, -1, 0]),
    "keyctl": (250, [0, 0, 0, 0, 0]),
    "add_key": (248, [0, 0, 0, 0, 0]),
    "request_key": (249, [0, 0, 0, 0]),
    "userfaultfd": (323, [0]),
    "io_uring_setup": (425, [1, 0]),
    "fanotify_init": (300, [0, 0]),
    # kernel and modules
    "kexec_load": (246, [0, 0, 0, 0]),
    "kexec_file_load": (320, [-1, -1, 0, 0, 0]),
    "init_module": (175, [0, 0, 0]),
    "finit_module": (313, [0, 0, 0]),
    "delete_module": (176, [0, 0]),
    "reboot": (169, [0xfee1dead, 672274793, 0x4321fedc, 0]),
    "syslog_read": (103, [3, 0, 0]),
    "swapon": (167, [0, 0]),
    "acct": (163, [0]),
    "settimeofday": (164, [0, 0]),
    "iopl": (172, [3]),
    "ioperm": (173, [0, 1024, 1]),
    # handles that bypass paths ("shocker")
    "name_to_handle_at": (303, [-100, 0, 0, 0, 0]),
    "open_by_handle_at": (304, [0, 0, 0]),
    # mounts and namespaces
    "mount": (165, [0, 0, 0, 0, 0]),
    "umount2": (166, [0, 0]),
    "pivot_root": (155, [0, 0]),
    "fsopen": (430, [0, 0]),
    "fsmount": (432, [0, 0, 0]),
    "open_tree": (428, [-100, 0, 0]),
    "move_mount": (429, [-100, 0, -100, 0, 0]),
    "mount_setattr": (442, [-100, 0, 0, 0, 0]),
    "unshare_user": (272, [CLONE_NEWUSER]),
    "unshare_mount": (272, [CLONE_NEWNS]),
    "unshare_net": (272, [CLONE_NEWNET]),
    "unshare_pid": (272, [CLONE_NEWPID]),
    "setns": (308, [0, 0]),
    "clone_newuser": (56, [CLONE_NEWUSER | 17, 0, 0, 0, 0]),
    "clone_newns": (56, [CLONE_NEWNS | 17, 0, 0, 0, 0]),
    "clone3": (435, [0, 0]),
    "personality": (135, [0x0040000]),
}

SYSCALL_PROBE = r"""
import ctypes, errno, json, sys
libc = ctypes.CDLL(None, use_errno=True)
calls = json.loads(sys.argv[1])
for name, (nr, args) in calls.items():
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    print(name, r, errno.errorcode.get(e, e) if r == -1 else "SUCCEEDED")
"""


@pytest.fixture(scope="module")
def syscall_results(sbx, box):
    import json
    res = sbx.exec(box, ["python3", "-c", SYSCALL_PROBE, json.dumps(SYSCALLS)], timeout_seconds=60)
    assert res.code == 0, res.describe()
    out = {}
    for line in res.out.splitlines():
        name, rc, why = line.split(" ", 2)
        out[name] = (int(rc), why)
    return out


@pytest.mark.parametrize("name", sorted(SYSCALLS))
def test_dangerous_syscall_is_denied(syscall_results, name):
    # Technique: call it directly (one syscall per name, see SYSCALLS).
    rc, why = syscall_results[name]
    expected = {"ENOSYS"} if name == "clone3" else {"EPERM"}
    assert rc == -1 and why in expected, f"{name}: rc={rc} {why}"


INT80_C = r"""
#include <errno.h>
#include <stdio.h>
/* The 32-bit entry point (int $0x80) has its own system call numbers: a
 * filter written for x86_64 numbers only would let these through. i386:
 * unshare = 310, mount = 21, ptrace = 26. */
static long sys32 (long nr, long a, long b, long c)
{
  long ret;
  __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
  return ret;
}
int main (void)
{
  long r = sys32 (310, 0x10000000 /* CLONE_NEWUSER */, 0, 0);
  printf ("unshare32 %ld\n", r);
  fflush (stdout);
  r = sys32 (26, 16 /* PTRACE_ATTACH */, 1, 0);
  printf ("ptrace32 %ld\n", r);
  return 0;
}
"""


def test_32bit_syscall_entry_does_not_bypass_the_filter(sbx, box):
    # Technique: the i386 ABI through int $0x80 (IA32 emulation is on for
    # x86_64 kernels by default).
    if sh(sbx, box, "command -v gcc").code != 0:
        pytest.skip("no gcc in the sandbox's image")
    res = sbx.exec(box, ["sh", "-c", "cat > /tmp/int80.c && gcc -O0 -o /tmp/int80 /tmp/int80.c && /tmp/int80; echo status=$?"],
                   stdin=INT80_C.encode(), timeout_seconds=120)
    # Killed by the filter (SIGSYS: status 159) or refused; never 0.
    for line in res.out.splitlines():
        if line.startswith(("unshare32", "ptrace32")):
            assert int(line.split()[1]) < 0, res.describe()
    assert "status=" in res.out, res.describe()


@pytest.mark.parametrize("cmd", [
    "unshare -U -r id",
    "unshare -m sh -c 'mount -t tmpfs t /mnt && echo MOUNTED'",
    "unshare -n true",
    "unshare -p -f true",
    "nsenter -t 1 -m -u -i -n -p true",
    "nsenter -t 1 --all true",
    "chroot /proc/1/root true",
])
def test_cannot_leave_or_make_namespaces(sbx, box, cmd):
    # Technique: util-linux's unshare/nsenter (new user namespace with full
    # capabilities inside; the namespaces of pid 1, which are the sandbox's
    # own, but through the holder's /proc entries).
    res = sh(sbx, box, f"{cmd} && echo ESCAPED")
    assert "ESCAPED" not in res.out and "MOUNTED" not in res.out, res.describe()


def test_kill_all_leaves_the_sandbox_working_and_the_host_alone(sbx, gateway, host_sleep):
    # Technique: kill -9 -1 (every process the caller may signal) from a
    # sandbox with background processes; pid 1 must survive and the host's
    # processes are out of reach.
    sid = sbx.launch().sandbox_id
    sbx.ok(sid, "nohup sleep 300 >/dev/null 2>&1 & nohup sleep 301 >/dev/null 2>&1 &")
    res = sh(sbx, sid, "kill -9 -1; kill -KILL 1; kill -TERM 1; kill -9 %d; echo done" % host_sleep.pid)
    assert "done" in res.out or res.exit.signal == 9, res.describe()
    assert host_sleep.poll() is None, "the host's sleep was killed"
    assert pid_alive(holder_pids(gateway, sid)[sid])
    assert_works(sbx, sid)
    # pidfd_send_signal to pid 1 (same target through another door).
    got = py(sbx, sid, r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(434, 1, 0)
print("pidfd", fd, libc.syscall(424, fd, 9, 0, 0) if fd >= 0 else "-")
""")
    assert got.code == 0, got.describe()
    assert pid_alive(holder_pids(gateway, sid)[sid])
    assert_works(sbx, sid)


def test_tiocsti_is_denied(sbx, box):
    # Technique: push characters into the input of a terminal (with a pty
    # of the sandbox's own: the same call on an inherited host terminal
    # would type commands there).
    res = py(sbx, box, r"""
import fcntl, os, pty, termios, errno
m, s = pty.openpty()
try:
    fcntl.ioctl(s, termios.TIOCSTI, b"x")
    print("TIOCSTI worked")
except OSError as e:
    print("denied", errno.errorcode[e.errno])
""")
    assert "denied EPERM" in res.out, res.describe()


def test_capabilities_are_cut(sbx, box):
    # The bounding set is what no exec can regain: no CAP_SYS_ADMIN,
    # CAP_SYS_PTRACE, CAP_SYS_MODULE, CAP_MKNOD, CAP_NET_ADMIN, CAP_SYS_RAWIO,
    # CAP_DAC_READ_SEARCH (shocker), CAP_SYSLOG; no_new_privs set; seccomp on.
    res = sh(sbx, box, "grep -E '^(CapBnd|CapEff|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status")
    fields = dict(line.split(":\t") for line in res.out.strip().splitlines())
    bnd = int(fields["CapBnd"], 16)
    for cap in (21, 19, 16, 27, 12, 17, 2, 34):  # SYS_ADMIN, SYS_PTRACE, SYS_MODULE, MKNOD, NET_ADMIN, SYS_RAWIO, DAC_READ_SEARCH, SYSLOG
        assert not bnd & (1 << cap), (cap, fields)
    assert int(fields["CapAmb"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2", fields


def memfds(pid: int, name: str) -> list[str]:
    """The descriptors of `pid` that are memory files called `name`."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(f"/memfd:{name} "):
                found.append(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            pass
    return found


def test_the_shared_filter_is_sealed_and_out_of_the_sandboxes_reach(sbx, gateway, box):
    # The filter every sandbox runs under is compiled once, by the gateway's
    # start-up, into one memory file that every launch reads. Anyone who
    # could write it would unconfine every later sandbox: it is sealed (no
    # write, no resize, no new seal, even through a writable descriptor),
    # and no process of a sandbox, its pid 1 included, holds a descriptor
    # of it.
    shared = memfds(gateway.pid, "seccomp")
    assert len(shared) == 1, shared
    before = open(shared[0], "rb").read()
    assert before and len(before) % 8 == 0
    with open(shared[0], "r+b", buffering=0) as f:
        for attempt in (lambda: f.write(b"\0" * 8), lambda: os.ftruncate(f.fileno(), 8),
                        lambda: os.ftruncate(f.fileno(), len(before) + 8)):
            with pytest.raises(PermissionError):
                attempt()
    assert open(shared[0], "rb").read() == before
    holder = holder_pids(gateway, box)[box]
    res = sh(sbx, box, "sleep 30 >/dev/null 2>&1 & echo $!")
    assert res.code == 0, res.describe()
    in_sandbox = [int(p) for p in os.listdir("/proc") if p.isdigit() and _in_sandbox(int(p), holder)]
    assert holder in in_sandbox and len(in_sandbox) >= 2, in_sandbox
    for pid in in_sandbox:
        assert memfds(pid, "seccomp") == [], f"pid {pid} of the sandbox holds the shared filter"
    # And the filter is what every process of the sandbox runs under.
    assert sh(sbx, box, "grep Seccomp: /proc/self/status").out.split() == ["Seccomp:", "2"]


def _in_sandbox(pid: int, holder: int) -> bool:
    """Whether host pid `pid` is in the pid namespace of the sandbox whose
    pid 1 is `holder`."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{holder}/ns/pid")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
