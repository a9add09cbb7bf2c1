/* helper/confine: capabilities, no_new_privs and seccomp for sandboxed
 * commands (see sbx_confine.h). No state. */
#include "gateway/helper/confine.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/socket.h>
#include <seccomp.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <linux/seccomp.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/cleanup.h"

/* Capabilities a sandbox's root keeps: Docker's default set without
 * CAP_MKNOD (no device nodes), CAP_AUDIT_WRITE and CAP_NET_RAW (hand-built
 * frames would bypass every filter that works on connections). */
static const int kept_caps[] = {
    CAP_CHOWN,   CAP_DAC_OVERRIDE, CAP_FSETID,           CAP_FOWNER,     CAP_SETGID, CAP_SETUID,
    CAP_SETFCAP, CAP_SETPCAP,      CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_KILL,
};

/* What sandbox-unpack keeps: making any owner, mode, xattr and whiteout a
 * tar names in the new layer. CAP_SYS_ADMIN only for overlay's opaque
 * marker (a trusted.* xattr); the mount family and every namespace call
 * stay denied by the filter. */
static const int unpacker_caps[] = {
    CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_MKNOD, CAP_SETFCAP, CAP_SYS_ADMIN,
};

static uint64_t
cap_mask (const int *caps, size_t n)
{
  uint64_t keep = 0;
  for (size_t i = 0; i < n; i++)
    keep |= 1ULL << caps[i];
  return keep;
}

/* Drops every capability but `keep` from the calling thread's bounding
 * set (inherited by its children, and across exec). */
static int
drop_bounding (uint64_t keep, const char **what)
{
  for (int cap = 0; cap <= 63; cap++)
    {
      if (keep & (1ULL << cap))
        continue;
      if (prctl (PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
        {
          *what = "drop a capability from the bounding set";
          return -1;
        }
    }
  return 0;
}

/* Sets the capability sets to `keep` (and the bounding set, with
 * `bounding`). Only system calls, no allocation: -1 with errno and *what
 * naming the step that failed (a static string). */
static int
set_caps (uint64_t keep, bool only_held, bool bounding, const char **what)
{
  if (only_held)
    {
      /* Keep what is wanted among what is held (a container may not give
       * CAP_MKNOD, which recent kernels do not need for whiteouts). */
      struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
      struct __user_cap_data_struct d[2];
      memset (d, 0, sizeof d);
      if (syscall (SYS_capget, &h, d) < 0)
        {
          *what = "capget";
          return -1;
        }
      keep &= (uint64_t) d[0].permitted | ((uint64_t) d[1].permitted << 32);
    }
  if (bounding && drop_bounding (keep, what) < 0)
    return -1;
  struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct data[2];
  memset (data, 0, sizeof data);
  data[0].effective = data[0].permitted = data[0].inheritable = (uint32_t) keep;
  data[1].effective = data[1].permitted = data[1].inheritable = (uint32_t) (keep >> 32);
  if (syscall (SYS_capset, &hdr, data) < 0)
    {
      *what = "capset";
      return -1;
    }
  /* Ambient capabilities would let them survive exec of non-root programs;
   * clear them so only root keeps its (reduced) set. */
  prctl (PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  return 0;
}

/* System calls no sandboxed program needs and that widen the kernel's
 * attack surface or reach outside the sandbox. */
/* clang-format off */
static const char *const denied_syscalls[] = {
    /* kernel and module control */
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff",
    "acct", "syslog", "iopl", "ioperm", "lookup_dcookie", "quotactl", "quotactl_fd", "nfsservctl",
    /* time */
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime",
    /* tracing, observing and handles that bypass paths */
    "bpf", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "open_by_handle_at",
    "name_to_handle_at", "userfaultfd", "fanotify_init",
    /* keyring */
    "keyctl", "add_key", "request_key",
    /* POSIX message queues: their limits are per host user, shared with
     * every other sandbox and the host's root (uid 0 everywhere) */
    "mq_open",
    /* io_uring: a large, fast-moving surface that bypasses seccomp checks on
     * the operations it performs */
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    /* mounts and namespaces: the sandbox's shape is fixed at launch */
    "mount", "umount", "umount2", "pivot_root", "setns", "unshare", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    /* misc */
    "personality", "vhangup", "uselib", "ustat", "sysfs", "_sysctl", "vm86", "vm86old", "get_kernel_syms",
    "query_module", "create_module", "pciconfig_read", "pciconfig_write", "pciconfig_iobase",
};
/* clang-format on */

/* The unpacker's extra denials: it needs no new sockets and runs nothing. */
static int
add_unpacker_rules (scmp_filter_ctx ctx)
{
  static const char *const denied[] = {"socket",  "socketpair", "connect",  "bind",   "listen", "accept",
                                       "accept4", "execve",     "execveat", "chroot", "fork",   "vfork"};
  int rc = 0;
  for (size_t i = 0; i < sizeof denied / sizeof denied[0] && rc == 0; i++)
    {
      int nr = seccomp_syscall_resolve_name (denied[i]);
      if (nr != __NR_SCMP_ERROR && nr >= 0)
        rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (EPERM), nr, 0);
    }
  return rc;
}

#ifndef __NR_fchmodat2
#define __NR_fchmodat2 452 /* Linux 6.6, the same number on every architecture; newer than libseccomp 2.5 */
#endif

/* With a writable volume: no setuid or setgid bit, made by any call that
 * sets a mode. A file a sandbox writes into a volume is a host file, where
 * `nosuid` (which holds inside) does not, and a set-id bit would hand its
 * owner's ids (the sandbox's, or a volume's owner) to any host user who ran
 * it. seccomp sees no paths, so the rule holds in the whole sandbox, where
 * set-id bits are dead anyway (no_new_privs, nosuid); what it costs is a
 * package whose installer sets one (dpkg then fails on it). openat2
 * carries its mode in memory seccomp cannot read: it answers ENOSYS, and
 * callers fall back to openat, which is checked. Snapshots still restore
 * the bits (the unpacker has its own filter and writes only the sandbox's
 * private layer). */
static int
add_setid_rules (scmp_filter_ctx ctx)
{
  static const struct
  {
    int nr;
    unsigned int mode_arg;
  } calls[] = {
      {SCMP_SYS (chmod), 1}, {SCMP_SYS (fchmod), 1}, {SCMP_SYS (fchmodat), 2},
      {__NR_fchmodat2, 2},   {SCMP_SYS (open), 2},   {SCMP_SYS (openat), 3},
      {SCMP_SYS (creat), 1}, {SCMP_SYS (mknod), 1},  {SCMP_SYS (mknodat), 2},
  };
  static const scmp_datum_t bits[] = {S_ISUID, S_ISGID};
  int rc = 0;
  for (size_t i = 0; i < sizeof calls / sizeof calls[0] && rc == 0; i++)
    for (size_t b = 0; b < 2 && rc == 0; b++)
      {
        struct scmp_arg_cmp cmp
            = {.arg = calls[i].mode_arg, .op = SCMP_CMP_MASKED_EQ, .datum_a = bits[b], .datum_b = bits[b]};
        rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (EPERM), calls[i].nr, 1, cmp);
      }
  if (rc == 0)
    rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (ENOSYS), SCMP_SYS (openat2), 0);
  return rc;
}

/* The capabilities and flags of a confinement; the filter is set apart. */
static void
set_kind (sbx_confine_t *out, bool unpacker)
{
  memset (out, 0, sizeof *out);
  out->only_held = unpacker;
  out->inherited = false;
  out->keep_caps = unpacker ? cap_mask (unpacker_caps, sizeof unpacker_caps / sizeof unpacker_caps[0])
                            : cap_mask (kept_caps, sizeof kept_caps / sizeof kept_caps[0]);
}

/* Compiles the filter into a new sealed memory file: its descriptor, or -1
 * with *err. */
static int
compile (bool unpacker, bool deny_setid, err_t *err)
{
  scmp_filter_ctx ctx = seccomp_init (SCMP_ACT_ALLOW);
  if (ctx == NULL)
    return err_make (err, ENOMEM, "seccomp_init");
  int rc = unpacker ? add_unpacker_rules (ctx) : deny_setid ? add_setid_rules (ctx) : 0;
  for (size_t i = 0; i < sizeof denied_syscalls / sizeof denied_syscalls[0] && rc == 0; i++)
    {
      int nr = seccomp_syscall_resolve_name (denied_syscalls[i]);
      if (nr == __NR_SCMP_ERROR || nr < 0)
        continue; /* not on this architecture */
      rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (EPERM), nr, 0);
    }
  /* clone() creating namespaces: denied. clone3 passes its flags in memory
   * that seccomp cannot read, so it answers ENOSYS and libc falls back to
   * clone, which is checked. */
  static const unsigned long ns_flags[] = {CLONE_NEWNS,  CLONE_NEWPID,    CLONE_NEWNET,  CLONE_NEWIPC,
                                           CLONE_NEWUTS, CLONE_NEWCGROUP, CLONE_NEWUSER, CLONE_NEWTIME};
  for (size_t i = 0; i < sizeof ns_flags / sizeof ns_flags[0] && rc == 0; i++)
    rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (EPERM), SCMP_SYS (clone), 1,
                           SCMP_A0 (SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
  if (rc == 0)
    rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (ENOSYS), SCMP_SYS (clone3), 0);
  /* Socket families network namespaces do not fence: vsock reaches the VM's
   * host and other VMs whatever the sandbox's network; the others are large
   * rarely used surfaces. */
  static const int families[] = {AF_VSOCK, AF_KEY, AF_TIPC, AF_RDS};
  for (size_t i = 0; i < sizeof families / sizeof families[0] && rc == 0; i++)
    rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (EAFNOSUPPORT), SCMP_SYS (socket), 1,
                           SCMP_A0 (SCMP_CMP_EQ, (scmp_datum_t) families[i]));
  /* Packet sockets and raw IP sockets: frames the sandbox builds itself
   * (ARP, spoofed sources, anything to the user-mode stack of egress). Also
   * refused by the kernel without CAP_NET_RAW; denied here whatever the
   * capabilities. Netlink's SOCK_RAW stays (ip(8) reads routes with it). */
  if (rc == 0)
    rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (EPERM), SCMP_SYS (socket), 1, SCMP_A0 (SCMP_CMP_EQ, AF_PACKET));
  static const int inet_families[] = {AF_INET, AF_INET6};
  for (size_t i = 0; i < sizeof inet_families / sizeof inet_families[0] && rc == 0; i++)
    rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (EPERM), SCMP_SYS (socket), 2,
                           SCMP_A0 (SCMP_CMP_EQ, (scmp_datum_t) inet_families[i]),
                           SCMP_A1 (SCMP_CMP_MASKED_EQ, 0xF /* the type, without flags */, SOCK_RAW));
  /* TIOCSTI pushes input into a terminal: another process's session. */
  if (rc == 0)
    rc = seccomp_rule_add (ctx, SCMP_ACT_ERRNO (EPERM), SCMP_SYS (ioctl), 1,
                           SCMP_A1 (SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, 0x5412u /* TIOCSTI */));
  /* Exported once into a memory file sealed against every change. */
  int mfd = rc == 0 ? memfd_create ("seccomp", MFD_CLOEXEC | MFD_ALLOW_SEALING) : -1;
  if (rc == 0 && mfd < 0)
    rc = -errno;
  if (rc == 0)
    rc = seccomp_export_bpf (ctx, mfd);
  seccomp_release (ctx);
  if (rc == 0 && fcntl (mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
    rc = -errno;
  if (rc < 0)
    {
      if (mfd >= 0)
        close (mfd);
      err_make_sys (err, -rc, "compile the seccomp filter");
      return -1;
    }
  return mfd;
}

/* Reads a compiled filter from `fd` into out->prog. */
static int
read_filter (sbx_confine_t *out, int fd, err_t *err)
{
  struct stat st;
  if (fstat (fd, &st) < 0)
    return err_make_sys (err, errno, "the compiled seccomp filter");
  size_t size = (size_t) st.st_size;
  if (size == 0 || size % sizeof (struct sock_filter) != 0 || size / sizeof (struct sock_filter) > BPF_MAXINSNS)
    return err_make (err, EINVAL, "the compiled seccomp filter has %zu bytes", size);
  struct sock_filter *insns = malloc (size);
  if (insns == NULL || pread (fd, insns, size, 0) != (ssize_t) size)
    {
      free (insns);
      return err_make (err, EIO, "read the compiled seccomp filter");
    }
  out->prog.len = (unsigned short) (size / sizeof *insns);
  out->prog.filter = insns;
  return 0;
}

int
sbx_confine_prepare_unpacker (sbx_confine_t *out, err_t *err)
{
  set_kind (out, true);
  cleanup_close int fd = compile (true, false, err);
  return fd < 0 ? -1 : read_filter (out, fd, err);
}

int
sbx_confine_export (bool deny_setid, err_t *err)
{
  return compile (false, deny_setid, err);
}

int
sbx_confine_load (sbx_confine_t *out, int fd, err_t *err)
{
  set_kind (out, false);
  return read_filter (out, fd, err);
}

int
sbx_confine_apply_raw (const sbx_confine_t *c, const char **what)
{
  if (set_caps (c->keep_caps, c->only_held, !c->inherited, what) < 0)
    return -1;
  if (c->inherited)
    return 0; /* the bounding set, no_new_privs and the filter came with fork */
  if (prctl (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    {
      *what = "PR_SET_NO_NEW_PRIVS";
      return -1;
    }
  if (syscall (SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &c->prog) < 0)
    {
      *what = "load the seccomp filter";
      return -1;
    }
  return 0;
}

int
sbx_confine_apply (const sbx_confine_t *c, err_t *err)
{
  const char *what = NULL;
  if (sbx_confine_apply_raw (c, &what) < 0)
    return err_make_sys (err, errno, "%s", what);
  return 0;
}

int
sbx_confine_hold (sbx_confine_t *c, err_t *err)
{
  if (c->only_held)
    return err_make (err, EINVAL, "a confinement that depends on what its process holds cannot be inherited");
  const char *what = NULL;
  if (drop_bounding (c->keep_caps, &what) < 0)
    return err_make_sys (err, errno, "%s", what);
  if (prctl (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    return err_make_sys (err, errno, "PR_SET_NO_NEW_PRIVS");
  if (syscall (SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &c->prog) < 0)
    return err_make_sys (err, errno, "load the seccomp filter");
  c->inherited = true;
  return 0;
}
