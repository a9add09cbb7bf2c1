/* sandbox-helper: the single-threaded program that does the gateway's
 * namespace, mount, cgroup and seccomp work.
 *
 * The gateway is multi-threaded, so it never forks to do this itself: it
 * spawns this helper (posix_spawn) with a report socket as fd 3 and reads
 * typed reports (sbx_report.h). Two modes:
 *
 *   launch  creates the sandbox's cgroups and its disk (a size-limited tmpfs
 *           holding the overlay's upper and work directories, in the host's
 *           mount namespace so snapshots can read it), then forks the holder:
 *           pid 1 of new pid, mount, network, ipc, uts and cgroup namespaces,
 *           whose root is an overlay of the image under that upper layer,
 *           with a fresh /proc (sensitive parts read-only or masked), a
 *           minimal /dev, no /sys and no host mount visible. The holder
 *           reaps orphans until the sandbox is deleted. Reports READY with
 *           the holder's pid, or ERROR.
 *   exec    joins a sandbox's namespaces, forks the command into its own
 *           cgroup (one per exec, so a timeout can kill all it started),
 *           confines it (sbx_confine) and execs it on the stdin/stdout/stderr
 *           it was given; reports EXIT with the status, or ERROR when the
 *           command could not be started.
 *
 * Every failure is reported as errno + text; the helper never leaves a
 * half-made sandbox unreported (the gateway tears down on ERROR).
 */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/limits.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/err.h"
#include "gateway/sbx_cgroup.h"
#include "gateway/sbx_confine.h"
#include "gateway/sbx_report.h"

#define MAX_VOLUMES 32

typedef struct helper_opts_s
{
  const char *id;
  const char *state;  /* the sandbox's state directory */
  const char *lower;  /* the image root */
  const char *cgroup_mount;
  const char *cgroup_group;
  const char *group;  /* exec: the exec's cgroup name */
  const char *cwd;
  const char *hostname;
  long disk_mb;
  long disk_inodes;
  sbx_cg_limits_t limits;
  pid_t pid;          /* exec: the holder */
  bool egress;        /* launch: the sandbox gets user-mode networking */
  bool restore;       /* launch: first unpack the tar on stdin into the layer */
  long max_entries;   /* restore: most tar entries accepted */
  const char *volumes[MAX_VOLUMES];
  size_t n_volumes;
  char **argv;        /* exec: the command */
} helper_opts_t;

static int report_fd = SBX_REPORT_FD;

static void
report (int fd, int type, int status, int a, int b, const char *text)
{
  sbx_report_t r;
  memset (&r, 0, sizeof r);
  r.type = type;
  r.status = status;
  r.a = a;
  r.b = b;
  if (text != NULL)
    snprintf (r.text, sizeof r.text, "%s", text);
  TEMP_FAILURE_RETRY (send (fd, &r, sizeof r, MSG_NOSIGNAL));
}

static void
report_err (int fd, const err_t *err)
{
  report (fd, SBX_REPORT_ERROR, err->status, 0, 0, err_msg (err));
}

/* ---- launch: the holder ---------------------------------------------------- */

static int
mkdir_p (const char *path, mode_t mode, err_t *err)
{
  char buf[PATH_MAX];
  snprintf (buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/')
      {
        *p = '\0';
        if (mkdir (buf, mode) < 0 && errno != EEXIST)
          return err_make_sys (err, errno, "mkdir `%s`", buf);
        *p = '/';
      }
  if (mkdir (buf, mode) < 0 && errno != EEXIST)
    return err_make_sys (err, errno, "mkdir `%s`", buf);
  return 0;
}

static int
bind_node (const char *root, const char *name, err_t *err)
{
  char src[64], dst[PATH_MAX * 2];
  snprintf (src, sizeof src, "/dev/%s", name);
  snprintf (dst, sizeof dst, "%s/dev/%s", root, name);
  cleanup_close int fd = open (dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
  if (fd < 0)
    return err_make_sys (err, errno, "create `%s`", dst);
  if (mount (src, dst, NULL, MS_BIND, NULL) < 0)
    return err_make_sys (err, errno, "bind `%s` on `%s`", src, dst);
  return 0;
}

static int
setup_dev (const char *root, err_t *err)
{
  char path[PATH_MAX * 2];
  snprintf (path, sizeof path, "%s/dev", root);
  if (mkdir_p (path, 0755, err) < 0)
    return -1;
  if (mount ("tmpfs", path, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m,nr_inodes=256") < 0)
    return err_make_sys (err, errno, "mount tmpfs on `%s`", path);
  static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
  for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
    if (bind_node (root, nodes[i], err) < 0)
      return -1;
  snprintf (path, sizeof path, "%s/dev/pts", root);
  if (mkdir (path, 0755) < 0)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  if (mount ("devpts", path, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") < 0)
    return err_make_sys (err, errno, "mount devpts on `%s`", path);
  snprintf (path, sizeof path, "%s/dev/shm", root);
  if (mkdir (path, 01777) < 0)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  if (mount ("shm", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=65536k") < 0)
    return err_make_sys (err, errno, "mount tmpfs on `%s`", path);
  static const char *const links[][2] = {
      {"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
      {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
  };
  for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
    {
      snprintf (path, sizeof path, "%s/dev/%s", root, links[i][1]);
      if (symlink (links[i][0], path) < 0)
        return err_make_sys (err, errno, "symlink `%s`", path);
    }
  return 0;
}

/* /proc as Docker leaves it: the kernel's knobs read-only, the leakiest
 * files masked. The sandbox's root has no CAP_SYS_ADMIN and no mount(2), so
 * it cannot undo this. */
static int
setup_proc (const char *root, err_t *err)
{
  char path[PATH_MAX * 2];
  snprintf (path, sizeof path, "%s/proc", root);
  if (mkdir_p (path, 0555, err) < 0)
    return -1;
  if (mount ("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
    return err_make_sys (err, errno, "mount proc on `%s`", path);
  static const char *const readonly[] = {"sys", "sysrq-trigger", "irq", "bus", "fs"};
  for (size_t i = 0; i < sizeof readonly / sizeof readonly[0]; i++)
    {
      snprintf (path, sizeof path, "%s/proc/%s", root, readonly[i]);
      if (access (path, F_OK) != 0)
        continue;
      if (mount (path, path, NULL, MS_BIND | MS_REC, NULL) < 0
          || mount (NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return err_make_sys (err, errno, "make `%s` read-only", path);
    }
  static const char *const masked_files[]
      = {"kcore", "keys", "timer_list", "sched_debug", "latency_stats", "kallsyms", "kpagecount", "kpageflags"};
  for (size_t i = 0; i < sizeof masked_files / sizeof masked_files[0]; i++)
    {
      snprintf (path, sizeof path, "%s/proc/%s", root, masked_files[i]);
      if (access (path, F_OK) != 0)
        continue;
      if (mount ("/dev/null", path, NULL, MS_BIND, NULL) < 0)
        return err_make_sys (err, errno, "mask `%s`", path);
    }
  static const char *const masked_dirs[] = {"acpi", "scsi"};
  for (size_t i = 0; i < sizeof masked_dirs / sizeof masked_dirs[0]; i++)
    {
      snprintf (path, sizeof path, "%s/proc/%s", root, masked_dirs[i]);
      if (access (path, F_OK) != 0)
        continue;
      if (mount ("tmpfs", path, "tmpfs", MS_RDONLY, "size=0") < 0)
        return err_make_sys (err, errno, "mask `%s`", path);
    }
  return 0;
}

static int
setup_volumes (const helper_opts_t *o, const char *root, err_t *err)
{
  for (size_t i = 0; i < o->n_volumes; i++)
    {
      /* host:sandbox[:ro], validated by the gateway. */
      char spec[PATH_MAX * 2];
      snprintf (spec, sizeof spec, "%s", o->volumes[i]);
      char *host = spec, *dst = strchr (spec, ':');
      if (dst == NULL)
        continue;
      *dst++ = '\0';
      char *mode = strchr (dst, ':');
      bool ro = false;
      if (mode != NULL)
        {
          *mode++ = '\0';
          ro = strcmp (mode, "ro") == 0;
        }
      char target[PATH_MAX];
      snprintf (target, sizeof target, "%s%s", root, dst);
      struct stat st;
      if (stat (host, &st) < 0)
        continue; /* warned about at gateway start */
      if (S_ISDIR (st.st_mode))
        {
          if (mkdir_p (target, 0755, err) < 0)
            return -1;
        }
      else
        {
          char parent[PATH_MAX];
          snprintf (parent, sizeof parent, "%s", target);
          *strrchr (parent, '/') = '\0';
          if (mkdir_p (parent, 0755, err) < 0)
            return -1;
          cleanup_close int fd = open (target, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        }
      if (mount (host, target, NULL, MS_BIND | MS_REC, NULL) < 0)
        return err_make_sys (err, errno, "bind `%s` on `%s`", host, dst);
      if (ro && mount (NULL, target, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC, NULL) < 0)
        return err_make_sys (err, errno, "make `%s` read-only", dst);
    }
  return 0;
}

static int
loopback_up (err_t *err)
{
  cleanup_close int s = socket (AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return err_make_sys (err, errno, "socket");
  struct ifreq ifr;
  memset (&ifr, 0, sizeof ifr);
  snprintf (ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  if (ioctl (s, SIOCGIFFLAGS, &ifr) < 0)
    return err_make_sys (err, errno, "get flags of lo");
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl (s, SIOCSIFFLAGS, &ifr) < 0)
    return err_make_sys (err, errno, "bring lo up");
  return 0;
}

/* With egress, slirp4netns routes everything out; the link-local range
 * (169.254.0.0/16, the cloud metadata server) is made unreachable inside
 * the sandbox, whose root cannot change routes (no CAP_NET_ADMIN). */
static int
block_link_local (err_t *err)
{
  cleanup_close int nl = socket (AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (nl < 0)
    return err_make_sys (err, errno, "netlink socket");
  struct
  {
    struct nlmsghdr nh;
    struct rtmsg rt;
    char attrs[64];
  } req;
  memset (&req, 0, sizeof req);
  req.nh.nlmsg_type = RTM_NEWROUTE;
  req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
  req.rt.rtm_family = AF_INET;
  req.rt.rtm_dst_len = 16;
  req.rt.rtm_table = RT_TABLE_MAIN;
  req.rt.rtm_protocol = RTPROT_STATIC;
  req.rt.rtm_scope = RT_SCOPE_NOWHERE;
  req.rt.rtm_type = RTN_UNREACHABLE;
  struct rtattr *rta = (struct rtattr *) req.attrs;
  rta->rta_type = RTA_DST;
  rta->rta_len = RTA_LENGTH (4);
  unsigned char dst[4] = {169, 254, 0, 0};
  memcpy (RTA_DATA (rta), dst, 4);
  req.nh.nlmsg_len = NLMSG_LENGTH (sizeof req.rt) + RTA_ALIGN (rta->rta_len);
  if (send (nl, &req, req.nh.nlmsg_len, 0) < 0)
    return err_make_sys (err, errno, "netlink send");
  char buf[512];
  ssize_t n = recv (nl, buf, sizeof buf, 0);
  if (n < (ssize_t) NLMSG_LENGTH (sizeof (struct nlmsgerr)))
    return err_make (err, EIO, "netlink: short answer");
  struct nlmsghdr *h = (struct nlmsghdr *) buf;
  if (h->nlmsg_type == NLMSG_ERROR)
    {
      struct nlmsgerr *e = NLMSG_DATA (h);
      if (e->error != 0)
        return err_make_sys (err, -e->error, "make 169.254.0.0/16 unreachable");
    }
  return 0;
}

/* Egress sandboxes resolve names through slirp4netns's DNS forwarder. */
static int
write_resolv_conf (const char *root, err_t *err)
{
  char path[PATH_MAX * 2];
  snprintf (path, sizeof path, "%s/etc", root);
  if (mkdir_p (path, 0755, err) < 0)
    return -1;
  snprintf (path, sizeof path, "%s/etc/resolv.conf", root);
  unlink (path);
  cleanup_close int fd = open (path, O_CREAT | O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    return err_make_sys (err, errno, "create `%s`", path);
  static const char text[] = "nameserver 10.0.2.3\n";
  if (write (fd, text, sizeof text - 1) != (ssize_t) sizeof text - 1)
    return err_make_sys (err, errno, "write `%s`", path);
  return 0;
}

/* Runs as pid 1 of the new pid namespace, still in the helper's mount
 * namespace until it unshares its own. */
static int
holder_setup (const helper_opts_t *o, const sbx_cg_layout_t *cg, err_t *err)
{
  if (sbx_cg_join (cg, o->id, "holder", err) < 0)
    return -1;
  if (unshare (CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP) < 0)
    return err_make_sys (err, errno, "unshare namespaces");
  if (mount (NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    return err_make_sys (err, errno, "make mounts private");

  char root[PATH_MAX], opts[PATH_MAX * 3 + 64];
  snprintf (root, sizeof root, "%s/root", o->state);
  snprintf (opts, sizeof opts, "lowerdir=%s,upperdir=%s/disk/upper,workdir=%s/disk/work", o->lower, o->state,
            o->state);
  if (mount ("overlay", root, "overlay", MS_NOSUID, opts) < 0)
    return err_make_sys (err, errno, "mount the overlay on `%s` (lower `%s`)", root, o->lower);
  if (setup_proc (root, err) < 0 || setup_dev (root, err) < 0 || setup_volumes (o, root, err) < 0)
    return -1;
  if (o->egress && write_resolv_conf (root, err) < 0)
    return -1;
  char path[PATH_MAX * 2];
  snprintf (path, sizeof path, "%s/root", root);
  if (mkdir_p (path, 0700, err) < 0)
    return -1;
  snprintf (path, sizeof path, "%s/tmp", root);
  if (mkdir_p (path, 01777, err) < 0)
    return -1;

  if (chdir (root) < 0)
    return err_make_sys (err, errno, "chdir `%s`", root);
  if (syscall (SYS_pivot_root, ".", ".") < 0)
    return err_make_sys (err, errno, "pivot_root");
  if (umount2 (".", MNT_DETACH) < 0)
    return err_make_sys (err, errno, "detach the old root");
  if (chdir ("/") < 0)
    return err_make_sys (err, errno, "chdir /");
  const char *hn = o->hostname != NULL ? o->hostname : "sandbox";
  if (sethostname (hn, strlen (hn)) < 0)
    return err_make_sys (err, errno, "sethostname");
  if (loopback_up (err) < 0)
    return -1;
  return o->egress ? block_link_local (err) : 0;
}

static void
noop_handler (int sig)
{
  (void) sig;
}

/* pid 1 of the sandbox: reaps orphans until it is killed. */
static void __attribute__ ((noreturn))
holder_loop (void)
{
  struct sigaction sa;
  memset (&sa, 0, sizeof sa);
  sa.sa_handler = noop_handler;
  sigaction (SIGCHLD, &sa, NULL);
  sigaction (SIGTERM, &sa, NULL);
  sigset_t set;
  sigemptyset (&set);
  sigaddset (&set, SIGCHLD);
  sigaddset (&set, SIGTERM);
  sigprocmask (SIG_BLOCK, &set, NULL);
  for (;;)
    {
      siginfo_t info;
      int sig = sigwaitinfo (&set, &info);
      if (sig == SIGTERM)
        _exit (0);
      while (waitpid (-1, NULL, WNOHANG) > 0)
        ;
    }
}

/* ---- launch --restore: the tar on stdin becomes the upper layer ------------ */

/* A tar path is acceptable when relative, without "..", and not empty. */
static bool
safe_path (const char *p)
{
  if (p == NULL || p[0] == '\0' || p[0] == '/')
    return false;
  for (const char *c = p; *c;)
    {
      const char *end = strchr (c, '/');
      size_t len = end != NULL ? (size_t) (end - c) : strlen (c);
      if (len == 2 && c[0] == '.' && c[1] == '.')
        return false;
      c += len;
      while (*c == '/')
        c++;
    }
  return true;
}

static int
ensure_parent (const char *path, err_t *err)
{
  char parent[PATH_MAX];
  snprintf (parent, sizeof parent, "%s", path);
  char *slash = strrchr (parent, '/');
  if (slash == NULL)
    return 0;
  *slash = '\0';
  return mkdir_p (parent, 0755, err);
}

/* OCI whiteouts become overlay whiteouts: ".wh..wh..opq" marks its
 * directory opaque, ".wh.NAME" becomes a 0:0 character device NAME. */
static int
apply_whiteout (const char *path, err_t *err)
{
  const char *base = strrchr (path, '/');
  base = base != NULL ? base + 1 : path;
  char dir[PATH_MAX];
  snprintf (dir, sizeof dir, "%.*s", (int) (base - path), path);
  if (dir[0] == '\0')
    snprintf (dir, sizeof dir, ".");
  if (mkdir_p (dir, 0755, err) < 0)
    return -1;
  if (strcmp (base, ".wh..wh..opq") == 0)
    {
      if (setxattr (dir, "trusted.overlay.opaque", "y", 1, 0) < 0)
        return err_make_sys (err, errno, "mark `%s` opaque", dir);
      return 0;
    }
  const char *name = base + 4;
  if (name[0] == '\0' || strcmp (name, ".") == 0 || strcmp (name, "..") == 0)
    return err_make (err, EINVAL, "bad whiteout `%s`", path);
  char target[PATH_MAX * 2];
  snprintf (target, sizeof target, "%s/%s", dir, name);
  struct stat st;
  if (lstat (target, &st) == 0)
    return err_make (err, EINVAL, "whiteout `%s` for a path the snapshot also contains", path);
  if (mknod (target, S_IFCHR | 0000, makedev (0, 0)) < 0)
    return err_make_sys (err, errno, "whiteout `%s`", target);
  return 0;
}

/* Copies the entry's extended attributes, dropping overlay's own (a
 * snapshot must not steer the overlay: redirects, origins, metacopy). */
static void
filter_xattrs (struct archive_entry *e)
{
  const char *name;
  const void *value;
  size_t size;
  size_t n = archive_entry_xattr_reset (e);
  if (n == 0)
    return;
  struct kept
  {
    char *name;
    void *value;
    size_t size;
  } *keep = calloc (n, sizeof *keep);
  size_t k = 0;
  while (keep != NULL && archive_entry_xattr_next (e, &name, &value, &size) == ARCHIVE_OK)
    if (strncmp (name, "trusted.overlay.", 16) != 0 && k < n)
      {
        keep[k].name = strdup (name);
        keep[k].value = malloc (size ? size : 1);
        if (keep[k].value != NULL)
          memcpy (keep[k].value, value, size);
        keep[k].size = size;
        k++;
      }
  archive_entry_xattr_clear (e);
  for (size_t i = 0; i < k; i++)
    {
      if (keep[i].name != NULL && keep[i].value != NULL)
        archive_entry_xattr_add_entry (e, keep[i].name, keep[i].value, keep[i].size);
      free (keep[i].name);
      free (keep[i].value);
    }
  free (keep);
}

static int
extract_fail (struct archive *a, const char *path, err_t *err)
{
  int e = archive_errno (a);
  if (e == ENOSPC || e == EDQUOT)
    return err_make (err, ENOSPC, "the snapshot does not fit in the sandbox's disk quota (at `%.200s`)",
                     path != NULL ? path : "?");
  return err_make (err, EINVAL, "bad snapshot at `%.200s`: %s", path != NULL ? path : "?",
                   archive_error_string (a) != NULL ? archive_error_string (a) : "unreadable");
}

/* Runs chrooted in the upper directory: nothing a tar says can reach out. */
static int
extract (long max_entries, err_t *err)
{
  struct archive *a = archive_read_new ();
  struct archive *w = archive_write_disk_new ();
  int rc = -1;
  archive_read_support_filter_all (a);
  archive_read_support_format_tar (a);
  archive_write_disk_set_options (w, ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_TIME
                                         | ARCHIVE_EXTRACT_XATTR | ARCHIVE_EXTRACT_SECURE_SYMLINKS
                                         | ARCHIVE_EXTRACT_SECURE_NODOTDOT
                                         | ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS);
  if (archive_read_open_fd (a, 0, 256 * 1024) != ARCHIVE_OK)
    {
      extract_fail (a, "(start)", err);
      goto out;
    }
  long entries = 0;
  for (;;)
    {
      struct archive_entry *e = NULL;
      int r = archive_read_next_header (a, &e);
      if (r == ARCHIVE_EOF)
        break;
      if (r < ARCHIVE_WARN)
        {
          extract_fail (a, "(next entry)", err);
          goto out;
        }
      if (++entries > max_entries)
        {
          err_make (err, EINVAL, "the snapshot has more than %ld entries (SANDBOX_SNAPSHOT_MAX_ENTRIES)", max_entries);
          goto out;
        }
      const char *path = archive_entry_pathname (e);
      while (path != NULL && path[0] == '.' && path[1] == '/')
        path += 2;
      if (path != NULL && strcmp (path, ".") == 0)
        continue; /* the root itself */
      if (!safe_path (path))
        {
          err_make (err, EINVAL, "unsafe path in the snapshot: `%.200s` (absolute or with ..)", path ? path : "");
          goto out;
        }
      archive_entry_set_pathname (e, path);
      const char *link = archive_entry_hardlink (e);
      if (link != NULL)
        {
          while (link[0] == '.' && link[1] == '/')
            link += 2;
          struct stat lst;
          if (!safe_path (link) || lstat (link, &lst) < 0 || !S_ISREG (lst.st_mode))
            {
              err_make (err, EINVAL, "hard link `%.200s` points outside the snapshot's files: `%.200s`", path, link);
              goto out;
            }
          archive_entry_set_hardlink (e, link);
        }
      mode_t type = archive_entry_filetype (e);
      if (link == NULL && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)
        {
          err_make (err, EINVAL, "device nodes, fifos and sockets are not allowed in a snapshot: `%.200s`", path);
          goto out;
        }
      const char *base = strrchr (path, '/');
      base = base != NULL ? base + 1 : path;
      if (strncmp (base, ".wh.", 4) == 0)
        {
          if (type != AE_IFREG || link != NULL)
            {
              err_make (err, EINVAL, "whiteout `%.200s` is not a plain file", path);
              goto out;
            }
          if (apply_whiteout (path, err) < 0)
            goto out;
          continue;
        }
      if (ensure_parent (path, err) < 0)
        goto out;
      filter_xattrs (e);
      if (archive_write_header (w, e) < ARCHIVE_WARN)
        {
          extract_fail (w, path, err);
          goto out;
        }
      if (archive_entry_size (e) > 0 && link == NULL)
        {
          const void *buf;
          size_t size;
          la_int64_t off;
          while ((r = archive_read_data_block (a, &buf, &size, &off)) == ARCHIVE_OK)
            if (archive_write_data_block (w, buf, size, off) < ARCHIVE_WARN)
              {
                extract_fail (w, path, err);
                goto out;
              }
          if (r != ARCHIVE_EOF)
            {
              extract_fail (a, path, err);
              goto out;
            }
        }
      if (archive_write_finish_entry (w) < ARCHIVE_WARN)
        {
          extract_fail (w, path, err);
          goto out;
        }
    }
  if (archive_write_close (w) < ARCHIVE_WARN)
    {
      extract_fail (w, "(end)", err);
      goto out;
    }
  rc = 0;
out:
  archive_read_free (a);
  archive_write_free (w);
  return rc;
}

/* Unpacks stdin into <disk>/upper in a child that is chrooted there. */
static int
restore_layer (const char *upper, long max_entries, err_t *err)
{
  pid_t pid = fork ();
  if (pid < 0)
    return err_make_sys (err, errno, "fork the unpacker");
  if (pid == 0)
    {
      err_t cerr = ERR_INIT;
      if (chdir (upper) < 0 || chroot (".") < 0 || chdir ("/") < 0)
        err_make_sys (&cerr, errno, "enter `%s`", upper);
      else if (extract (max_entries, &cerr) == 0)
        _exit (0);
      report_err (report_fd, &cerr);
      _exit (1);
    }
  int status = 0;
  while (waitpid (pid, &status, 0) < 0)
    if (errno != EINTR)
      return err_make_sys (err, errno, "wait for the unpacker");
  if (WIFEXITED (status) && WEXITSTATUS (status) == 0)
    return 0;
  if (WIFEXITED (status) && WEXITSTATUS (status) == 1)
    return 1; /* it reported why */
  return err_make (err, EIO, "the unpacker died (status %d)", status);
}

static int
do_launch (const helper_opts_t *o)
{
  err_t err = ERR_INIT;
  sbx_cg_layout_t cg;
  if (sbx_cg_detect (o->cgroup_mount, o->cgroup_group, &cg, &err) < 0 || sbx_cg_prepare (&cg, &err) < 0
      || sbx_cg_create (&cg, o->id, &o->limits, &err) < 0)
    goto fail;

  char disk[PATH_MAX], path[PATH_MAX * 2], mopts[128];
  snprintf (disk, sizeof disk, "%s/disk", o->state);
  snprintf (path, sizeof path, "%s/root", o->state);
  if (mkdir_p (disk, 0700, &err) < 0 || mkdir_p (path, 0755, &err) < 0)
    goto fail;
  snprintf (mopts, sizeof mopts, "size=%ldm,nr_inodes=%ld,mode=0755", o->disk_mb, o->disk_inodes);
  if (mount ("sandbox-disk", disk, "tmpfs", MS_NOSUID | MS_NODEV, mopts) < 0)
    {
      err_make_sys (&err, errno, "mount the disk tmpfs on `%s`", disk);
      goto fail;
    }
  snprintf (path, sizeof path, "%s/upper", disk);
  if (mkdir (path, 0755) < 0)
    {
      err_make_sys (&err, errno, "mkdir `%s`", path);
      goto fail;
    }
  snprintf (path, sizeof path, "%s/work", disk);
  if (mkdir (path, 0700) < 0)
    {
      err_make_sys (&err, errno, "mkdir `%s`", path);
      goto fail;
    }
  if (o->restore)
    {
      snprintf (path, sizeof path, "%s/upper", disk);
      int r = restore_layer (path, o->max_entries, &err);
      if (r == 1)
        return 1;
      if (r < 0)
        goto fail;
    }

  int sync[2];
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) < 0)
    {
      err_make_sys (&err, errno, "socketpair");
      goto fail;
    }
  if (unshare (CLONE_NEWPID) < 0)
    {
      err_make_sys (&err, errno, "unshare the pid namespace");
      goto fail;
    }
  pid_t pid = fork ();
  if (pid < 0)
    {
      err_make_sys (&err, errno, "fork the holder");
      goto fail;
    }
  if (pid == 0)
    {
      close (sync[0]);
      close (report_fd);
      err_t cerr = ERR_INIT;
      if (holder_setup (o, &cg, &cerr) < 0)
        {
          report_err (sync[1], &cerr);
          _exit (1);
        }
      int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
      if (null >= 0)
        {
          dup2 (null, 0);
          dup2 (null, 1);
          dup2 (null, 2);
        }
      report (sync[1], SBX_REPORT_READY, 0, 1, 0, NULL);
      syscall (SYS_close_range, 3, ~0U, 0);
      holder_loop ();
    }
  close (sync[1]);
  sbx_report_t r;
  memset (&r, 0, sizeof r);
  ssize_t n = TEMP_FAILURE_RETRY (recv (sync[0], &r, sizeof r, 0));
  if (n != (ssize_t) sizeof r)
    {
      int status = 0;
      waitpid (pid, &status, 0);
      err_make (&err, ECHILD, "the sandbox's pid 1 died during set-up (status %d)", status);
      goto fail;
    }
  if (r.type != SBX_REPORT_READY)
    {
      kill (pid, SIGKILL);
      waitpid (pid, NULL, 0);
      report (report_fd, SBX_REPORT_ERROR, r.status, 0, 0, r.text);
      return 1;
    }
  report (report_fd, SBX_REPORT_READY, 0, pid, 0, NULL);
  return 0;

fail:
  report_err (report_fd, &err);
  err_release (&err);
  return 1;
}

/* ---- exec ------------------------------------------------------------------ */

static int
open_ns (pid_t pid, const char *name, err_t *err)
{
  char path[64];
  snprintf (path, sizeof path, "/proc/%d/ns/%s", (int) pid, name);
  int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  return fd;
}

static void __attribute__ ((noreturn))
exec_child (const helper_opts_t *o, const int *cg_fds, size_t n_cg, int cgroup_ns)
{
  err_t err = ERR_INIT;
  for (size_t i = 0; i < n_cg; i++)
    if (TEMP_FAILURE_RETRY (write (cg_fds[i], "0", 1)) != 1)
      {
        err_make_sys (&err, errno, "join the exec's cgroup");
        goto fail;
      }
  if (setns (cgroup_ns, CLONE_NEWCGROUP) < 0)
    {
      err_make_sys (&err, errno, "join the cgroup namespace");
      goto fail;
    }
  if (chdir (o->cwd) < 0)
    {
      err_make_sys (&err, errno, "working directory `%s`", o->cwd);
      goto fail;
    }
  sigset_t none;
  sigemptyset (&none);
  sigprocmask (SIG_SETMASK, &none, NULL);
  for (int s = 1; s < NSIG; s++)
    signal (s, SIG_DFL);
  if (sbx_confine_apply (&err) < 0)
    goto fail;
  execvp (o->argv[0], o->argv);
  err_make_sys (&err, errno, "exec `%s`", o->argv[0]);
fail:
  report_err (report_fd, &err);
  _exit (err.status == ENOENT ? 127 : 126);
}

static int
do_exec (const helper_opts_t *o)
{
  err_t err = ERR_INIT;
  sbx_cg_layout_t cg;
  int cg_fds[SBX_CG_MAX_HIER];
  size_t n_cg = 0;
  /* Die with the gateway: the command itself lives on in the sandbox until
   * it ends or the sandbox is deleted. */
  prctl (PR_SET_PDEATHSIG, SIGKILL);
  if (sbx_cg_detect (o->cgroup_mount, o->cgroup_group, &cg, &err) < 0 || sbx_cg_create_sub (&cg, o->id, o->group, &err) < 0
      || sbx_cg_open_procs (&cg, o->id, o->group, cg_fds, &n_cg, &err) < 0)
    goto fail;

  static const struct
  {
    const char *name;
    int type;
  } order[] = {{"ipc", CLONE_NEWIPC}, {"uts", CLONE_NEWUTS}, {"net", CLONE_NEWNET}, {"pid", CLONE_NEWPID},
               {"mnt", CLONE_NEWNS}};
  int fds[5];
  for (size_t i = 0; i < 5; i++)
    if ((fds[i] = open_ns (o->pid, order[i].name, &err)) < 0)
      goto fail;
  int cgroup_ns = open_ns (o->pid, "cgroup", &err);
  if (cgroup_ns < 0)
    goto fail;
  for (size_t i = 0; i < 5; i++)
    {
      if (setns (fds[i], order[i].type) < 0)
        {
          err_make_sys (&err, errno, "join the sandbox's %s namespace", order[i].name);
          goto fail;
        }
      close (fds[i]);
    }

  pid_t child = fork ();
  if (child < 0)
    {
      err_make_sys (&err, errno, "fork");
      goto fail;
    }
  if (child == 0)
    exec_child (o, cg_fds, n_cg, cgroup_ns);

  /* Let go of the command's stdio so the gateway sees EOF when it is done. */
  int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0)
    {
      dup2 (null, 0);
      dup2 (null, 1);
      dup2 (null, 2);
      close (null);
    }
  for (size_t i = 0; i < n_cg; i++)
    close (cg_fds[i]);
  close (cgroup_ns);

  int status = 0;
  while (waitpid (child, &status, 0) < 0)
    if (errno != EINTR)
      {
        err_make_sys (&err, errno, "wait for the command");
        goto fail;
      }
  if (WIFSIGNALED (status))
    report (report_fd, SBX_REPORT_EXIT, 0, -1, WTERMSIG (status), NULL);
  else
    report (report_fd, SBX_REPORT_EXIT, 0, WEXITSTATUS (status), 0, NULL);
  return 0;

fail:
  report_err (report_fd, &err);
  err_release (&err);
  return 1;
}

/* ---- main ------------------------------------------------------------------ */

static long
num (const char *s)
{
  return strtol (s, NULL, 10);
}

int
main (int argc, char **argv)
{
  if (argc < 2)
    {
      fprintf (stderr, "sandbox-helper: run by sandbox-gateway only (launch|exec ...)\n");
      return 2;
    }
  /* Only the report socket crosses over; nothing else leaks in. */
  syscall (SYS_close_range, SBX_REPORT_FD + 1, ~0U, 0);
  fcntl (report_fd, F_SETFD, FD_CLOEXEC);

  helper_opts_t o;
  memset (&o, 0, sizeof o);
  o.cgroup_mount = "/sys/fs/cgroup";
  o.cgroup_group = "sandbox-gateway";
  o.lower = "/";
  o.cwd = "/root";
  o.disk_mb = 2048;
  static const struct option longopts[] = {
      {"id", required_argument, NULL, 'i'},      {"state", required_argument, NULL, 's'},
      {"lower", required_argument, NULL, 'l'},   {"cgroup-mount", required_argument, NULL, 'c'},
      {"group", required_argument, NULL, 'g'},   {"cwd", required_argument, NULL, 'w'},
      {"disk-mb", required_argument, NULL, 'd'}, {"disk-inodes", required_argument, NULL, 'n'},
      {"pids", required_argument, NULL, 'p'},    {"memory-mb", required_argument, NULL, 'm'},
      {"cpu-millis", required_argument, NULL, 'u'}, {"pid", required_argument, NULL, 'P'},
      {"volume", required_argument, NULL, 'v'},  {"hostname", required_argument, NULL, 'h'},
      {"egress", no_argument, NULL, 'e'},        {"cgroup-group", required_argument, NULL, 'G'},
      {"restore", no_argument, NULL, 'R'},       {"max-entries", required_argument, NULL, 'E'},
      {NULL, 0, NULL, 0},
  };
  optind = 2;
  int c;
  while ((c = getopt_long (argc, argv, "+", longopts, NULL)) != -1)
    switch (c)
      {
      case 'i': o.id = optarg; break;
      case 's': o.state = optarg; break;
      case 'l': o.lower = optarg; break;
      case 'c': o.cgroup_mount = optarg; break;
      case 'g': o.group = optarg; break;
      case 'w': o.cwd = optarg; break;
      case 'd': o.disk_mb = num (optarg); break;
      case 'n': o.disk_inodes = num (optarg); break;
      case 'p': o.limits.pids_max = num (optarg); break;
      case 'm': o.limits.memory_mb = num (optarg); break;
      case 'u': o.limits.cpu_millis = num (optarg); break;
      case 'P': o.pid = (pid_t) num (optarg); break;
      case 'h': o.hostname = optarg; break;
      case 'e': o.egress = true; break;
      case 'G': o.cgroup_group = optarg; break;
      case 'R': o.restore = true; break;
      case 'E': o.max_entries = num (optarg); break;
      case 'v':
        if (o.n_volumes < MAX_VOLUMES)
          o.volumes[o.n_volumes++] = optarg;
        break;
      default: return 2;
      }
  if (o.max_entries <= 0)
    o.max_entries = 1000000;
  if (o.disk_inodes <= 0)
    o.disk_inodes = o.disk_mb * 128;
  if (o.id == NULL)
    {
      report (report_fd, SBX_REPORT_ERROR, EINVAL, 0, 0, "sandbox-helper: --id is required");
      return 2;
    }
  if (strcmp (argv[1], "launch") == 0 && o.state != NULL)
    return do_launch (&o);
  if (strcmp (argv[1], "exec") == 0 && o.pid > 0 && o.group != NULL && optind < argc)
    {
      o.argv = argv + optind;
      return do_exec (&o);
    }
  report (report_fd, SBX_REPORT_ERROR, EINVAL, 0, 0, "sandbox-helper: bad arguments");
  return 2;
}
