/* sandbox-helper: the single-threaded program that makes a sandbox.
 *
 * The gateway is multi-threaded, so it never forks to do namespace, mount
 * or cgroup work itself: it spawns this helper (posix_spawn) with a report
 * socket as fd 3 and reads typed reports (sbx_report.h). The helper creates
 * the sandbox's cgroups and its disk (a size-limited tmpfs holding the
 * overlay's upper and work directories, in the host's mount namespace so
 * snapshots can read it), unpacks a snapshot into it when restoring (with
 * sandbox-unpack), then forks the holder: pid 1 of new pid, mount, network,
 * ipc, uts and cgroup namespaces, whose root is an overlay of the image
 * under that upper layer, with a fresh /proc (sensitive parts read-only or
 * masked), a minimal /dev, no /sys and no host mount visible. It reports
 * READY with the holder's pid and control socket, or ERROR, and exits.
 *
 * The holder stays: it reaps orphans and starts commands on the gateway's
 * request (serve_request): it forks each one from inside the sandbox into
 * the exec's own cgroup (so a timeout kills all it started), cuts its
 * capabilities, sets no_new_privs, loads the seccomp filter compiled once at
 * launch, and reports how it ended.
 *
 * Every failure is reported as errno + text; the gateway tears down what a
 * failed launch made.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/limits.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <arpa/inet.h>
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <poll.h>
#include <unistd.h>

extern char **environ;

#include "common/cleanup.h"
#include "common/err.h"
#include "gateway/runtime/cgroup.h"
#include "gateway/helper/confine.h"
#include "gateway/runtime/wire.h"

#define MAX_VOLUMES 32

typedef struct helper_opts_s
{
  const char *id;
  const char *state;  /* the sandbox's state directory */
  const char *lower;  /* the image root */
  const char *cgroup_mount;
  const char *cgroup_group;
  const char *hostname;
  long disk_mb;
  long disk_inodes;
  sbx_cg_limits_t limits;
  bool egress;        /* launch: the sandbox gets user-mode networking */
  bool restore;       /* launch: first unpack the tar on stdin into the layer */
  long max_entries;   /* restore: most tar entries accepted */
  const char *unpacker; /* restore: path of sandbox-unpack */
  const char *volumes[MAX_VOLUMES];
  size_t n_volumes;
  const char *masks[MAX_VOLUMES];  /* host paths hidden inside */
  size_t n_masks;
  const char *blocked[MAX_VOLUMES]; /* host IPv4 addresses unreachable with egress */
  size_t n_blocked;
} helper_opts_t;

static int report_fd = SBX_REPORT_FD;

/* The memory of this program's arguments, scrubbed in the sandbox's pid 1:
 * its command line is readable inside and names host paths and the id. */
static char *args_start;
static size_t args_len;

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

/* Makes `dst`/`len` (IPv4) unreachable inside the sandbox, whose root
 * cannot change routes (no CAP_NET_ADMIN). */
static int
block_route (const unsigned char dst[4], int len, err_t *err)
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
  req.rt.rtm_dst_len = (unsigned char) len;
  req.rt.rtm_table = RT_TABLE_MAIN;
  req.rt.rtm_protocol = RTPROT_STATIC;
  req.rt.rtm_scope = RT_SCOPE_NOWHERE;
  req.rt.rtm_type = RTN_UNREACHABLE;
  struct rtattr *rta = (struct rtattr *) req.attrs;
  rta->rta_type = RTA_DST;
  rta->rta_len = RTA_LENGTH (4);
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
      if (e->error != 0 && e->error != -EEXIST)
        return err_make_sys (err, -e->error, "make %u.%u.%u.%u/%d unreachable", dst[0], dst[1], dst[2], dst[3],
                             len);
    }
  return 0;
}

/* With egress, slirp4netns connects out from the host: the link-local range
 * (the cloud metadata server) and the host's own addresses (given with
 * --block; its loopback slirp4netns refuses itself) must stay out of reach. */
static int
block_egress_routes (const helper_opts_t *o, err_t *err)
{
  static const unsigned char link_local[4] = {169, 254, 0, 0};
  if (block_route (link_local, 16, err) < 0)
    return -1;
  for (size_t i = 0; i < o->n_blocked; i++)
    {
      struct in_addr a;
      if (inet_pton (AF_INET, o->blocked[i], &a) != 1)
        continue;
      if (block_route ((const unsigned char *) &a.s_addr, 32, err) < 0)
        return -1;
    }
  return 0;
}

/* Hides host paths the sandbox's image would otherwise show (the lower
 * layer is often the host's or the container's own root): the gateway's
 * state and snapshot directories, key and credential files. A directory
 * gets an empty read-only tmpfs over it, a file /dev/null. */
static int
mask_paths (const helper_opts_t *o, const char *root, err_t *err)
{
  for (size_t i = 0; i < o->n_masks; i++)
    {
      char path[PATH_MAX * 2];
      snprintf (path, sizeof path, "%s%s", root, o->masks[i]);
      struct stat st;
      if (lstat (path, &st) < 0)
        continue; /* not in the image */
      int rc = S_ISDIR (st.st_mode) ? mount ("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                                             "size=0,mode=0555")
                                    : mount ("/dev/null", path, NULL, MS_BIND, NULL);
      if (rc < 0)
        return err_make_sys (err, errno, "mask `%s`", o->masks[i]);
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
  /* pid 1 sits in the sandbox's own group, which roots the sandbox's
   * cgroup namespace: its commands can move to their exec-N groups below. */
  if (sbx_cg_join (cg, o->id, NULL, err) < 0)
    return -1;
  if (unshare (CLONE_NEWCGROUP | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) < 0)
    return err_make_sys (err, errno, "unshare namespaces");
  if (mount (NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    return err_make_sys (err, errno, "make mounts private");

  char root[PATH_MAX], disk[PATH_MAX], opts[PATH_MAX + 64];
  snprintf (root, sizeof root, "%s/root", o->state);
  snprintf (disk, sizeof disk, "%s/disk", o->state);
  /* Upper and work are named relative to the disk, so the mount options
   * (visible in the sandbox's mountinfo) do not show where it lives. Device
   * files of the image are dead inside (nodev); /dev is a tmpfs of its own. */
  snprintf (opts, sizeof opts, "lowerdir=%s,upperdir=upper,workdir=work", o->lower);
  if (chdir (disk) < 0)
    return err_make_sys (err, errno, "chdir `%s`", disk);
  if (mount ("overlay", root, "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
    return err_make_sys (err, errno, "mount the overlay on `%s` (lower `%s`)", root, o->lower);
  if (setup_proc (root, err) < 0 || setup_dev (root, err) < 0 || mask_paths (o, root, err) < 0
      || setup_volumes (o, root, err) < 0)
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
  return o->egress ? block_egress_routes (o, err) : 0;
}

/* ---- the holder: pid 1 of the sandbox --------------------------------------- */

/* A command started by the holder, and where its end is reported. */
typedef struct running_s
{
  pid_t pid;
  int report;
} running_t;

static running_t *running;
static size_t n_running, cap_running;

static void __attribute__ ((noreturn))
command_child (const sbx_confine_t *confine, const int *fds, const char *cwd, char **argv, char **env)
{
  err_t err = ERR_INIT;
  int report = fds[3];
  if (dup2 (fds[0], 0) < 0 || dup2 (fds[1], 1) < 0 || dup2 (fds[2], 2) < 0)
    {
      err_make_sys (&err, errno, "set up stdio");
      goto fail;
    }
  /* Into the exec's own cgroup: a timeout kills all this command starts. */
  if (TEMP_FAILURE_RETRY (write (fds[4], "0", 1)) != 1)
    {
      err_make_sys (&err, errno, "join the exec's cgroup");
      goto fail;
    }
  if (chdir (cwd) < 0)
    {
      err_make_sys (&err, errno, "working directory `%s`", cwd);
      goto fail;
    }
  /* Open files are a host-wide table: with the process limit, this bounds
   * what one sandbox can hold. */
  struct rlimit nofile = {.rlim_cur = 1024, .rlim_max = 1024};
  setrlimit (RLIMIT_NOFILE, &nofile);
  sigset_t none;
  sigemptyset (&none);
  sigprocmask (SIG_SETMASK, &none, NULL);
  for (int s = 1; s < NSIG; s++)
    signal (s, SIG_DFL);
  if (sbx_confine_apply (confine, &err) < 0)
    goto fail;
  /* Only stdio and the report socket (close-on-exec) cross over. */
  for (int i = 0; i < SBX_EXEC_FDS; i++)
    if (fds[i] > 2 && fds[i] != report)
      close (fds[i]);
  environ = env; /* execvp looks PATH up in the new environment */
  execvp (argv[0], argv);
  err_make_sys (&err, errno, "exec `%s`", argv[0]);
fail:
  report_err (report, &err);
  _exit (err.status == ENOENT ? 127 : 126);
}

/* Serves one exec request from the control socket. */
static void
serve_request (int ctl, const sbx_confine_t *confine, char *buf)
{
  int fds[SBX_EXEC_FDS];
  size_t n_fds = 0;
  ssize_t n = sbx_recv_fds (ctl, buf, SBX_EXEC_MAX, fds, &n_fds, SBX_EXEC_FDS);
  if (n == 0)
    _exit (0); /* the gateway has gone: so does the sandbox */
  if (n < 0)
    return;
  if (n_fds != SBX_EXEC_FDS)
    {
      for (size_t i = 0; i < n_fds; i++)
        close (fds[i]);
      return;
    }
  static char *argv[4096], *env[4096];
  const char *cwd = NULL;
  if (sbx_exec_decode (buf, (size_t) n, &cwd, argv, 4096, env, 4096) < 0)
    {
      report (fds[3], SBX_REPORT_ERROR, EINVAL, 0, 0, "malformed exec request");
      for (int i = 0; i < SBX_EXEC_FDS; i++)
        close (fds[i]);
      return;
    }
  if (n_running == cap_running)
    {
      size_t cap = cap_running ? cap_running * 2 : 16;
      running_t *g = realloc (running, cap * sizeof *g);
      if (g == NULL)
        {
          report (fds[3], SBX_REPORT_ERROR, ENOMEM, 0, 0, "the sandbox's pid 1 is out of memory");
          for (int i = 0; i < SBX_EXEC_FDS; i++)
            close (fds[i]);
          return;
        }
      running = g;
      cap_running = cap;
    }
  pid_t pid = fork ();
  if (pid == 0)
    {
      close (ctl);
      command_child (confine, fds, cwd, argv, env);
    }
  if (pid < 0)
    report (fds[3], SBX_REPORT_ERROR, errno, 0, 0, "fork the command (process limit reached?)");
  else
    running[n_running++] = (running_t){pid, fds[3]};
  for (int i = 0; i < SBX_EXEC_FDS; i++)
    if (i != 3 || pid < 0)
      close (fds[i]);
}

/* Reaps every child that ended; reports those that were commands. */
static void
reap_children (void)
{
  int status;
  pid_t pid;
  while ((pid = waitpid (-1, &status, WNOHANG)) > 0)
    for (size_t i = 0; i < n_running; i++)
      if (running[i].pid == pid)
        {
          if (WIFSIGNALED (status))
            report (running[i].report, SBX_REPORT_EXIT, 0, -1, WTERMSIG (status), NULL);
          else
            report (running[i].report, SBX_REPORT_EXIT, 0, WEXITSTATUS (status), 0, NULL);
          close (running[i].report);
          running[i] = running[--n_running];
          break;
        }
}

/* pid 1 of the sandbox: starts commands on request and reaps orphans until
 * the sandbox is deleted. Signals from inside the sandbox cannot reach it:
 * it handles none (SIGCHLD is taken through a signalfd). */
static void __attribute__ ((noreturn))
holder_loop (int ctl, const sbx_confine_t *confine)
{
  sigset_t set;
  sigemptyset (&set);
  sigaddset (&set, SIGCHLD);
  sigprocmask (SIG_BLOCK, &set, NULL);
  int sfd = signalfd (-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  char *buf = malloc (SBX_EXEC_MAX);
  if (sfd < 0 || buf == NULL)
    _exit (1);
  for (;;)
    {
      struct pollfd p[2] = {{.fd = ctl, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
      if (poll (p, 2, -1) < 0)
        continue;
      if (p[1].revents)
        {
          struct signalfd_siginfo si;
          while (read (sfd, &si, sizeof si) == sizeof si)
            ;
          reap_children ();
        }
      if (p[0].revents & (POLLIN | POLLHUP | POLLERR))
        serve_request (ctl, confine, buf);
    }
}

/* Unpacks stdin into <disk>/upper with sandbox-unpack, which chroots there
 * first. 0 ok; 1 it failed and reported why; -1 with *err. */
static int
restore_layer (const helper_opts_t *o, const char *upper, err_t *err)
{
  char max[24];
  snprintf (max, sizeof max, "%ld", o->max_entries);
  pid_t pid = fork ();
  if (pid < 0)
    return err_make_sys (err, errno, "fork the unpacker");
  if (pid == 0)
    {
      char *const argv[] = {(char *) "sandbox-unpack", (char *) upper, max, NULL};
      fcntl (report_fd, F_SETFD, 0); /* the unpacker reports on fd 3 too */
      execv (o->unpacker, argv);
      err_t cerr = ERR_INIT;
      err_make_sys (&cerr, errno, "exec `%s`", o->unpacker);
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
  if (sbx_cg_detect (o->cgroup_mount, o->cgroup_group, o->limits.cpu_millis > 0, &cg, &err) < 0 || sbx_cg_prepare (&cg, &err) < 0
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
      int r = restore_layer (o, path, &err);
      if (r == 1)
        return 1;
      if (r < 0)
        goto fail;
    }

  int sync[2], ctl[2];
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) < 0
      || socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0)
    {
      err_make_sys (&err, errno, "socketpair");
      goto fail;
    }
  sbx_confine_t confine;
  if (sbx_confine_prepare (&confine, &err) < 0)
    goto fail;
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
      close (ctl[0]);
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
      close (sync[1]);
      if (args_start != NULL)
        {
          memset (args_start, 0, args_len);
          snprintf (args_start, args_len, "sandbox-init");
        }
      if (ctl[1] != 3)
        {
          dup2 (ctl[1], 3);
          close (ctl[1]);
        }
      syscall (SYS_close_range, 4, ~0U, 0);
      holder_loop (3, &confine);
    }
  close (sync[1]);
  close (ctl[1]);
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
  sbx_report_t ready;
  memset (&ready, 0, sizeof ready);
  ready.type = SBX_REPORT_READY;
  ready.a = pid;
  if (sbx_send_fds (report_fd, &ready, sizeof ready, &ctl[0], 1) < 0)
    {
      kill (pid, SIGKILL);
      err_make_sys (&err, errno, "hand the control socket over");
      goto fail;
    }
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
      fprintf (stderr, "sandbox-helper: run by sandbox-gateway only (launch ...)\n");
      return 2;
    }
  args_start = argv[0];
  args_len = (size_t) (argv[argc - 1] + strlen (argv[argc - 1]) - argv[0]);
  /* Only the report socket crosses over; nothing else leaks in. */
  syscall (SYS_close_range, SBX_REPORT_FD + 1, ~0U, 0);
  fcntl (report_fd, F_SETFD, FD_CLOEXEC);

  helper_opts_t o;
  memset (&o, 0, sizeof o);
  o.cgroup_mount = "/sys/fs/cgroup";
  o.cgroup_group = "sandbox-gateway";
  o.lower = "/";
  o.disk_mb = 2048;
  static const struct option longopts[] = {
      {"id", required_argument, NULL, 'i'},      {"state", required_argument, NULL, 's'},
      {"lower", required_argument, NULL, 'l'},   {"cgroup-mount", required_argument, NULL, 'c'},
      {"disk-mb", required_argument, NULL, 'd'}, {"disk-inodes", required_argument, NULL, 'n'},
      {"pids", required_argument, NULL, 'p'},    {"memory-mb", required_argument, NULL, 'm'},
      {"cpu-millis", required_argument, NULL, 'u'},
      {"volume", required_argument, NULL, 'v'},  {"hostname", required_argument, NULL, 'h'},
      {"egress", no_argument, NULL, 'e'},        {"cgroup-group", required_argument, NULL, 'G'},
      {"restore", no_argument, NULL, 'R'},       {"max-entries", required_argument, NULL, 'E'},
      {"unpacker", required_argument, NULL, 'U'},
      {"mask", required_argument, NULL, 'M'},    {"block", required_argument, NULL, 'B'},
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
      case 'd': o.disk_mb = num (optarg); break;
      case 'n': o.disk_inodes = num (optarg); break;
      case 'p': o.limits.pids_max = num (optarg); break;
      case 'm': o.limits.memory_mb = num (optarg); break;
      case 'u': o.limits.cpu_millis = num (optarg); break;
      case 'h': o.hostname = optarg; break;
      case 'e': o.egress = true; break;
      case 'G': o.cgroup_group = optarg; break;
      case 'R': o.restore = true; break;
      case 'E': o.max_entries = num (optarg); break;
      case 'U': o.unpacker = optarg; break;
      case 'M':
        if (o.n_masks < MAX_VOLUMES)
          o.masks[o.n_masks++] = optarg;
        break;
      case 'B':
        if (o.n_blocked < MAX_VOLUMES)
          o.blocked[o.n_blocked++] = optarg;
        break;
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
  report (report_fd, SBX_REPORT_ERROR, EINVAL, 0, 0, "sandbox-helper: bad arguments");
  return 2;
}
