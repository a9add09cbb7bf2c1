"""Reaching the host's files and kernel knobs from inside a sandbox.

The secret is `host_canary`: a file on a tmpfs mounted on the host at
/tmp/sgw-canary-XXXX (the sandbox sees the empty mount point through its
lower layer, never the file). Every test tries one way of reaching it, or
one way of touching the host's kernel, and asserts it fails.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

import pytest

from tests.lib.security import assert_works, py, sh


def assert_not_leaked(res, token: str) -> None:
    assert token not in res.out and token not in res.err, f"the canary leaked\n{res.describe()}"


def test_canary_is_not_visible_through_the_lower_layer(sbx, box, host_canary):
    # Baseline: the plain path shows the empty mount point of the lower layer.
    path, token = host_canary
    res = sh(sbx, box, f"cat {path} 2>&1; ls -la {path.parent} 2>&1")
    assert_not_leaked(res, token)


# Technique: /proc/<pid>/root and /proc/<pid>/cwd of every process the
# sandbox can see (pid 1 is the holder, which has every capability), then
# the host path of the canary below them.
PROC_ROOT_WALK = r"""
import os, sys
target = sys.argv[1]
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    for link in ("root", "cwd"):
        base = f"/proc/{pid}/{link}"
        for path in (base + target, base + "/.." * 8 + target):
            try:
                with open(path) as f:
                    print("READ", path, f.read())
            except OSError as e:
                print("no", path, e.strerror)
        try:
            print("LS", base, os.listdir(base)[:5])
        except OSError as e:
            print("no ls", base, e.strerror)
"""


def test_proc_pid_root_and_cwd_do_not_reach_the_host(sbx, box, host_canary):
    path, token = host_canary
    res = sbx.exec(box, ["python3", "-c", PROC_ROOT_WALK, str(path)], timeout_seconds=30)
    assert_not_leaked(res, token)
    # pid 1 (the holder) keeps full capabilities: its root, cwd, fds, memory
    # and environment must stay out of reach of a command.
    probe = py(sbx, box, r"""
import os
for p in ("/proc/1/root/", "/proc/1/cwd/", "/proc/1/fd/3", "/proc/1/environ", "/proc/1/mem", "/proc/1/map_files/"):
    try:
        if p.endswith("/"):
            os.listdir(p)
        else:
            open(p, "rb").read(1)
        print("OPEN", p)
    except OSError as e:
        print("denied", p, e.strerror)
""")
    assert "OPEN" not in probe.out, probe.describe()


def test_mountinfo_paths_do_not_lead_to_the_host(sbx, box, host_canary):
    # Technique: /proc/self/mountinfo names the host paths of the overlay's
    # upper, work and lower directories; try every path it mentions, and the
    # canary below each.
    path, token = host_canary
    res = py(sbx, box, r"""
import os, re, sys
target = %r
paths = set()
for line in open("/proc/self/mountinfo"):
    for m in re.finditer(r"(?:lowerdir|upperdir|workdir)=([^,\s]+)", line):
        paths.add(m.group(1))
    paths.add(line.split()[3])
for p in sorted(paths):
    for q in (p, p + "/../../../../.." + target, p + target):
        try:
            if os.path.isdir(q):
                print("LS", q, os.listdir(q)[:10])
            else:
                print("READ", q, open(q).read(200))
        except OSError as e:
            print("no", q, e.strerror)
""" % str(path))
    assert_not_leaked(res, token)


SHOCKER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "shocker": open_by_handle_at() opens an inode by handle, without a path,
 * from any mount of the same filesystem. /dev/null is a bind of the host's
 * devtmpfs and / is the overlay over the host's root: a handle guessed for
 * either could open host files outside the sandbox. */
int main (void)
{
  const char *mounts[] = {"/", "/dev/null", "/etc/hostname"};
  int failures = 0;
  for (int i = 0; i < 3; i++)
    {
      struct { struct file_handle fh; unsigned char buf[128]; } h;
      h.fh.handle_bytes = 128;
      int mnt = -1;
      if (name_to_handle_at (AT_FDCWD, mounts[i], &h.fh, &mnt, 0) == 0)
        printf ("ESCAPE name_to_handle_at %s worked\n", mounts[i]);
      else
        printf ("name_to_handle_at %s: %s\n", mounts[i], strerror (errno));
      int mfd = open (mounts[i], O_RDONLY);
      /* A brute-force handle: ext4/shmem style inode 2 (the root). */
      h.fh.handle_bytes = 8;
      h.fh.handle_type = 1;
      unsigned int ino_gen[2] = {2, 0};
      memcpy (h.fh.f_handle, ino_gen, 8);
      int fd = open_by_handle_at (mfd, &h.fh, O_RDONLY);
      if (fd >= 0)
        printf ("ESCAPE open_by_handle_at via %s worked\n", mounts[i]);
      else
        printf ("open_by_handle_at %s: %s\n", mounts[i], strerror (errno));
      if (mfd >= 0)
        close (mfd);
    }
  return failures;
}
"""


def test_open_by_handle_at_shocker_is_denied(sbx, box):
    # Technique: compile the classic "shocker" inside the sandbox (gcc comes
    # with the lower layer) and run it.
    have_gcc = sh(sbx, box, "command -v gcc")
    if have_gcc.code != 0:
        pytest.skip("no gcc in the sandbox's image")
    res = sbx.exec(box, ["sh", "-c", "cat > /tmp/shocker.c && gcc -O0 -o /tmp/shocker /tmp/shocker.c && /tmp/shocker"],
                   stdin=SHOCKER_C.encode(), timeout_seconds=120)
    assert res.code == 0, res.describe()
    assert "ESCAPE" not in res.out, res.describe()
    assert res.out.count("Operation not permitted") == 6, res.describe()


def test_no_device_nodes_can_be_made(sbx, box):
    # Technique: mknod of the host's disk, memory and kernel log (CAP_MKNOD
    # is dropped), and look for such nodes in the sandbox's /dev.
    res = sh(sbx, box, r"""
for spec in "b 8 0 sda" "b 253 0 vda" "b 254 0 vdb" "c 1 1 mem" "c 1 2 kmem" "c 1 11 kmsg" "c 10 235 autofs" "c 4 1 tty1"; do
  set -- $spec
  if mknod /tmp/node-$3 $1 $2 $3 2>/dev/null; then echo "MADE $3"; fi
  if mknod /dev/node-$3 $1 $2 $3 2>/dev/null; then echo "MADE dev/$3"; fi
done
for n in mem kmem port kmsg sda vda nvme0n1 xvda loop0 fuse net/tun kvm vsock vhost-vsock mapper/control btrfs-control autofs console tty0 tty1 ttyS0 hwrng cpu/0/msr; do
  if [ -b /dev/$n ] || [ -c /dev/$n ]; then echo "PRESENT /dev/$n"; fi
done
true""")
    assert "MADE" not in res.out and "PRESENT" not in res.out, res.describe()
    listing = set(sh(sbx, box, "ls -A /dev").out.split())
    assert listing <= {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm",
                       "fd", "stdin", "stdout", "stderr"}, listing


@pytest.fixture
def planted_nodes():
    """Device nodes planted by the test in a fresh directory of the host's
    root filesystem (the sandbox's lower layer with SANDBOX_ROOTFS=/): they
    stand for any node an image carries (debootstrap'ed or extracted images
    do; this machine's root has some under /root/.cache). `kmsg` is the
    kernel log (c 1 11), `disk` the host's root disk (block)."""
    d = Path(f"/var/tmp/sgw-devnode-{secrets.token_hex(6)}")
    d.mkdir(mode=0o755)
    nodes = {}
    try:
        for name, mode, dev in (("kmsg", stat.S_IFCHR | 0o600, os.makedev(1, 11)),
                                ("disk", stat.S_IFBLK | 0o600, os.stat("/").st_dev)):
            with contextlib.suppress(OSError):
                os.mknod(d / name, mode, dev)
                nodes[name] = d / name
        if not nodes:
            pytest.skip("cannot make device nodes here")
        yield nodes
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


@pytest.mark.finding("F2")
def test_device_nodes_of_the_image_are_dead_inside_the_sandbox(sbx, box, planted_nodes):
    # Technique: the overlay root is mounted nosuid but not nodev, so a
    # device node that exists in the lower layer (the image) opens the real
    # device. Opening the kernel log for writing (no write is made) shows
    # it; a disk node would give the raw host disk (this machine happens to
    # refuse block-device opens even to the host's root, other hosts do not).
    res = py(sbx, box, r"""
import os, sys
for name, path in %r:
    try:
        fd = os.open(path, (os.O_WRONLY if name == "kmsg" else os.O_RDONLY) | os.O_NONBLOCK | os.O_NOCTTY)
        print("OPENED", name, path)
        os.close(fd)
    except OSError as e:
        print("denied", name, e.strerror)
""" % sorted((k, str(v)) for k, v in planted_nodes.items()))
    assert res.code == 0, res.describe()
    assert "OPENED" not in res.out, f"a device node of the image works in the sandbox\n{res.describe()}"


@pytest.mark.parametrize("fstype,source", [
    ("proc", "proc"), ("sysfs", "sysfs"), ("devtmpfs", "devtmpfs"), ("cgroup", "cgroup"),
    ("cgroup2", "cgroup2"), ("tmpfs", "tmpfs"), ("overlay", "overlay"), ("debugfs", "debugfs"),
])
def test_no_new_mounts(sbx, box, fstype, source):
    # Technique: mount a fresh proc (host pids), sysfs, devtmpfs (every host
    # device), cgroupfs (limits), tmpfs, debugfs; and a bind of / that would
    # undo the read-only /proc/sys.
    opts = "-o none,name=x" if fstype == "cgroup" else ""
    res = sh(sbx, box, f"""mkdir -p /tmp/m-{fstype}
mount -t {fstype} {opts} {source} /tmp/m-{fstype} && echo MOUNTED
mount --bind / /tmp/m-{fstype} && echo BOUND
mount -o remount,rw /proc/sys && echo REMOUNTED
umount /proc/sys && echo UNMOUNTED
umount -l /dev/null && echo UNMOUNTED
true""")
    for word in ("MOUNTED", "BOUND", "REMOUNTED", "UNMOUNTED"):
        assert word not in res.out, res.describe()


def test_kernel_knobs_stay_read_only(sbx, box):
    # Technique: write the kernel's global settings through /proc/sys (the
    # core_pattern pipe is the classic container escape), /proc/sysrq-trigger
    # and /sys.
    before = open("/proc/sys/kernel/core_pattern").read()
    res = sh(sbx, box, r"""
for f in /proc/sys/kernel/core_pattern /proc/sys/kernel/modprobe /proc/sys/kernel/hostname \
         /proc/sys/vm/drop_caches /proc/sys/kernel/panic /proc/sysrq-trigger /proc/sys/fs/binfmt_misc/register \
         /proc/sys/net/ipv4/ip_forward /sys/kernel/uevent_helper /sys/fs/cgroup/pids/pids.max /proc/self/oom_score_adj; do
  case $f in
    */core_pattern) v='|/tmp/pwn' ;; */oom_score_adj) v=-1000 ;; */drop_caches) v=3 ;; *) v=0 ;;
  esac
  if (printf '%s\n' "$v" > "$f") 2>/dev/null; then echo "WROTE $f"; fi
done
ls /sys 2>/dev/null | head -3 | sed 's/^/SYS /'
true""")
    assert "WROTE" not in res.out and "SYS " not in res.out, res.describe()
    assert open("/proc/sys/kernel/core_pattern").read() == before


def test_chroot_and_dotdot_stay_inside_the_sandbox(sbx, box, host_canary):
    # Technique: the classic chroot escape (CAP_SYS_CHROOT is kept): chroot
    # into a subdirectory while holding a descriptor of the old root, fchdir
    # out, climb with "..", chroot("."). It must land on the sandbox's own
    # root (its overlay, moved over the base mount namespace's empty tmpfs),
    # neither the host's nor the base's.
    path, token = host_canary
    res = py(sbx, box, r"""
import os
target = %r
open("/escape-marker", "w").close()
os.makedirs("/tmp/jail/a/b", exist_ok=True)
fd = os.open("/", os.O_RDONLY)
os.chroot("/tmp/jail")
os.fchdir(fd)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
print("root:", open("/proc/self/mountinfo").readline().split()[4])
print("MARKER", os.path.exists("/escape-marker"), "LISTING", sorted(os.listdir("/")))
print("MOUNTS", open("/proc/self/mountinfo").read())
try:
    print("READ", open(target).read())
except OSError as e:
    print("no canary:", e.strerror)
print("pids:", sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[:3])
# And chroot into /proc/1/root (the holder's root).
try:
    os.chroot("/proc/1/root")
    print("CHROOT /proc/1/root worked:", os.listdir("/")[:5])
except OSError as e:
    print("no /proc/1/root:", e.strerror)
""" % str(path))
    assert res.code == 0, res.describe()
    assert_not_leaked(res, token)
    assert "pids: [1," in res.out, res.describe()  # still the sandbox's pid namespace
    # On its own root, with its own files: not the base's empty tmpfs.
    assert "MARKER True" in res.out and "'proc'" in res.out, res.describe()
    mounts = res.out.split("MOUNTS", 1)[1]
    assert " / / " in mounts and "sandbox-base" not in mounts and " /lower " not in mounts, res.describe()
    assert_works(sbx, box)
