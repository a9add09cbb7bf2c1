/* helper/userns: the sandbox's own user namespace. Its ids 0..range-1 are
 * host ids base.. that no other live sandbox has (the gateway's pool), so
 * root inside is an unprivileged host uid, and an escape is that uid.
 *
 * The namespace owns nothing but itself: the sandbox's mount, network, ipc,
 * uts, cgroup and pid namespaces are made by the holder as host root before
 * it moves into the user namespace, so root inside has its capabilities
 * over its own ids and files only, never over those namespaces (no mount,
 * no network administration, whatever a capability set says). The image
 * is an idmapped mount through it: its host-root files appear owned by
 * root inside. Volumes are not (helper/rootfs.c): what a sandbox writes
 * there keeps its own host ids, or an owner the operator chose.
 * Single-threaded. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/helper.h"

int helper_userns_fd = -1;

/* Writes "0 base range" to /proc/<pid>/<file>. */
static int
write_map (pid_t pid, const char *file, const helper_opts_t *o, err_t *err)
{
  char path[64], map[64];
  snprintf (path, sizeof path, "/proc/%d/%s", (int) pid, file);
  int len = helper_id_map_line (map, sizeof map, 0, o->uid_base, o->uid_range);
  if (len < 0)
    return err_make (err, ENAMETOOLONG, "the %s line does not fit %zu bytes", file, sizeof map);
  cleanup_close int fd = open (path, O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write (fd, map, (size_t) len) != len)
    return err_make_sys (err, errno, "write %s `%s`", file, map);
  return 0;
}

/* In the child: the namespace is made by (so owned by) the sandbox's own
 * root, host uid uid_base, not by the host's root. The kernel charges what
 * a namespace uses of per-user limits (inotify instances, user namespaces,
 * …) to its owner in the parent namespace too: owned by the host's root,
 * every sandbox would share that root's counts, and could exhaust them for
 * the host. The capabilities are kept across the change of uid only to
 * pass distributions' checks on making user namespaces. */
static int
owned_unshare (const helper_opts_t *o)
{
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2];
  if (prctl (PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0 || syscall (SYS_capget, &h, d) < 0)
    return -1;
  if (setgroups (0, NULL) < 0 || setresgid ((gid_t) o->uid_base, (gid_t) o->uid_base, (gid_t) o->uid_base) < 0
      || setresuid ((uid_t) o->uid_base, (uid_t) o->uid_base, (uid_t) o->uid_base) < 0)
    return -1;
  d[0].effective = d[0].permitted;
  d[1].effective = d[1].permitted;
  if (syscall (SYS_capset, &h, d) < 0)
    return -1;
  return unshare (CLONE_NEWUSER);
}

/* The child making the namespace, between start and finish. */
static pid_t maker = -1;
static int maker_sock = -1;

int
helper_userns_start (const helper_opts_t *o, err_t *err)
{
  /* A child makes the namespace, hands over a descriptor of it (its own:
   * the gateway may lack CAP_SYS_PTRACE to open another uid's) and waits
   * while this process, privileged in the parent namespace, writes its
   * maps. It runs while this process does other work. */
  cleanup_pipe int sock[2] = {-1, -1};
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sock) < 0)
    return err_make_sys (err, errno, "socketpair");
  pid_t pid = fork ();
  if (pid < 0)
    return err_make_sys (err, errno, "fork");
  if (pid == 0)
    {
      close (sock[0]);
      int ok = owned_unshare (o) == 0 ? 0 : errno;
      int fd = ok == 0 ? open ("/proc/self/ns/user", O_RDONLY | O_CLOEXEC) : -1;
      if (ok == 0 && fd < 0)
        ok = errno;
      char done;
      if (sbx_send_fds (sock[1], &ok, sizeof ok, &fd, fd >= 0 ? 1 : 0) == 0)
        (void) !read (sock[1], &done, 1); /* until the parent is done */
      _exit (0);
    }
  maker = pid;
  maker_sock = take_fd (&sock[0]);
  return 0;
}

int
helper_userns_finish (const helper_opts_t *o, err_t *err)
{
  int ok = 0, rc = 0;
  size_t n_fds = 0;
  if (sbx_recv_fds (maker_sock, &ok, sizeof ok, &helper_userns_fd, &n_fds, 1) != (ssize_t) sizeof ok)
    rc = err_make (err, EIO, "make the sandbox's user namespace: the child died");
  else if (ok != 0 || n_fds != 1)
    rc = err_make_sys (err, ok != 0 ? ok : EIO, "make the sandbox's user namespace");
  if (rc == 0 && (write_map (maker, "uid_map", o, err) < 0 || write_map (maker, "gid_map", o, err) < 0))
    rc = -1;
  close (maker_sock); /* the child reads EOF and exits */
  maker_sock = -1;
  return rc;
}

void
helper_userns_reap (void)
{
  if (maker_sock >= 0)
    close (maker_sock); /* not finished (a launch that failed): let it go */
  maker_sock = -1;
  if (maker > 0)
    while (waitpid (maker, NULL, 0) < 0 && errno == EINTR)
      ;
  maker = -1;
}

int
helper_userns_make (const helper_opts_t *o, err_t *err)
{
  int rc = helper_userns_start (o, err) < 0 ? -1 : helper_userns_finish (o, err);
  helper_userns_reap ();
  return rc;
}

int
helper_userns_enter (err_t *err)
{
  if (setns (helper_userns_fd, CLONE_NEWUSER) < 0)
    return err_make_sys (err, errno, "enter the sandbox's user namespace");
  if (setgroups (0, NULL) < 0 || setresgid (0, 0, 0) < 0 || setresuid (0, 0, 0) < 0)
    return err_make_sys (err, errno, "become root of the sandbox's user namespace");
  return 0;
}

int
helper_idmapped_clone (const char *path, bool recursive, unsigned long attr_set, int *out, err_t *err)
{
  unsigned int rec = recursive ? AT_RECURSIVE : 0;
  cleanup_close int fd = open_tree (AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | rec);
  if (fd < 0)
    return err_make_sys (err, errno, "clone the mount at `%s`", path);
  struct mount_attr attr = {.attr_set = attr_set | MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t) helper_userns_fd};
  if (mount_setattr (fd, "", AT_EMPTY_PATH | rec, &attr, sizeof attr) < 0)
    return err_make_sys (err, errno, "idmap `%s` (its filesystem must support idmapped mounts)", path);
  *out = take_fd (&fd);
  return 0;
}

/* The probe's steps, in its own mount namespace on a scratch tmpfs at
 * o->state: the image idmapped, an overlay with `userxattr` over it, every
 * volume cloned as a launch clones it. */
static int
probe_steps (const helper_opts_t *o, err_t *err)
{
  /* Each volume as a launch takes it, from the gateway's descriptor (of a
   * mount in this namespace: first), idmapped when it names an owner. */
  for (size_t i = 0; i < o->n_volumes; i++)
    {
      helper_volume_t v;
      helper_parse_volume (o->volumes[i], &v);
      cleanup_close int tree = -1;
      if (helper_volume_clone (&v, SBX_VOLUME_FD0 + (int) i, o->uid_base, &tree, err) < 0)
        return err_wrap (err, "SANDBOX_VOLUME_MOUNTS");
    }
  if (unshare (CLONE_NEWNS) < 0 || mount (NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    return err_make_sys (err, errno, "a private mount namespace");
  if (helper_userns_make (o, err) < 0)
    return -1;
  if (helper_mkdir_p (o->state, 0700, err) < 0)
    return -1;
  if (mount ("probe", o->state, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700") < 0)
    return err_make_sys (err, errno, "mount a tmpfs on `%s`", o->state);
  if (chdir (o->state) < 0)
    return err_make_sys (err, errno, "chdir `%s`", o->state);
  static const char *const dirs[] = {"lower", "upper", "work", "root"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
    if (mkdir (dirs[i], 0755) < 0)
      return err_make_sys (err, errno, "mkdir `%s`", dirs[i]);
  if (chown ("upper", (uid_t) o->uid_base, (gid_t) o->uid_base) < 0)
    return err_make_sys (err, errno, "chown the upper directory");
  cleanup_close int lower = -1;
  if (helper_idmapped_clone (o->lower, false, 0, &lower, err) < 0)
    return err_wrap (err, "SANDBOX_ROOTFS");
  if (move_mount (lower, "", AT_FDCWD, "lower", MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return err_make_sys (err, errno, "attach the idmapped image");
  if (mount ("overlay", "root", "overlay", MS_NOSUID | MS_NODEV, HELPER_USERNS_OVERLAY_OPTS ("lower")) < 0)
    return err_make_sys (err, errno, "mount an overlay with userxattr over the idmapped image");
  return 0;
}

int
helper_probe (const helper_opts_t *o)
{
  cleanup_err err_t err = ERR_INIT;
  int rc = probe_steps (o, &err);
  if (chdir ("/") == 0 && umount2 (o->state, MNT_DETACH) == 0)
    rmdir (o->state);
  if (rc < 0)
    {
      helper_report_err (helper_report_fd, &err);
      return 1;
    }
  sbx_report_ready (helper_report_fd, 0, -1);
  return 0;
}
