/* helper/launch: making a sandbox — its cgroups, its disk (a size-limited
 * detached tmpfs holding the overlay's upper and work directories), the snapshot
 * unpacked into it when restoring (sandbox-unpack), then the holder forked
 * into a new pid namespace, listening on <state>/ctl; READY with the
 * holder's pid and the disk goes to the gateway, or ERROR. Single-threaded. */
#include <errno.h>
#include <fcntl.h>
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
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/helper.h"

/* Unpacks stdin into <disk>/upper with sandbox-unpack, which chroots there
 * first; with a user namespace, it runs inside it as the sandbox's root.
 * 0 ok; 1 it failed and reported why; -1 with *err. */
static int
restore_layer (const helper_opts_t *o, err_t *err)
{
  char max[24];
  snprintf (max, sizeof max, "%ld", o->max_entries);
  /* Opened here, as the host's root: the sandbox's root may not be able
   * to reach either through the host's directories. */
  cleanup_close int dir = openat (helper_disk_fd, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  cleanup_close int exe = open (o->unpacker, O_RDONLY | O_CLOEXEC);
  if (dir < 0 || exe < 0)
    return err_make_sys (err, errno, "open `%s`", dir < 0 ? "upper" : o->unpacker);
  pid_t pid = fork ();
  if (pid < 0)
    return err_make_sys (err, errno, "fork the unpacker");
  if (pid == 0)
    {
      char *const argv[]
          = {(char *) "sandbox-unpack", (char *) ".", max, o->uid_range > 0 ? (char *) "userxattr" : NULL, NULL};
      err_t cerr = ERR_INIT;
      fcntl (helper_report_fd, F_SETFD, 0); /* the unpacker reports on fd 3 too */
      if (fchdir (dir) < 0)
        err_make_sys (&cerr, errno, "enter the new layer");
      else if (o->uid_range == 0 || helper_userns_enter (&cerr) == 0)
        {
          execveat (exe, "", argv, environ, AT_EMPTY_PATH);
          err_make_sys (&cerr, errno, "exec `%s`", o->unpacker);
        }
      helper_report_err (helper_report_fd, &cerr);
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

int helper_disk_fd = -1;

/* The disk's `huge` option, on a tmpfs being made or reconfigured; best
 * effort (EINVAL: a kernel without transparent huge pages). */
static int
set_huge (int fs, const char *value)
{
  return fsconfig (fs, FSCONFIG_SET_STRING, "huge", value, 0) < 0 && errno != EINVAL ? -1 : 0;
}

/* A restore writes whole files in large pieces: with huge=within_size the
 * disk keeps them in large folios (never past a file's end), which halves
 * what the kernel spends per page on allocation and memory charges. The
 * sandbox itself runs with huge=never: a byte it writes into a sparse file
 * costs a page, not 2 MiB (SEEK_DATA, its disk quota and its export would
 * all see 2 MiB). */
static int
restore_done (err_t *err)
{
  cleanup_close int fs = fspick (helper_disk_fd, "", FSPICK_EMPTY_PATH | FSPICK_CLOEXEC);
  if (fs < 0 || set_huge (fs, "never") < 0 || fsconfig (fs, FSCONFIG_CMD_RECONFIGURE, NULL, NULL, 0) < 0)
    return err_make_sys (err, errno, "reconfigure the disk after the restore");
  return 0;
}

/* The sandbox's disk: a size- and inode-capped tmpfs made as a detached
 * mount (fsopen/fsmount) into helper_disk_fd. It is attached only in the
 * holder's mount namespace; the gateway keeps a descriptor of it for
 * snapshots. */
static int
make_disk (const helper_opts_t *o, err_t *err)
{
  char size[32], inodes[32];
  snprintf (size, sizeof size, "%ldm", o->disk_mb);
  snprintf (inodes, sizeof inodes, "%ld", o->disk_inodes);
  cleanup_close int fs = fsopen ("tmpfs", FSOPEN_CLOEXEC);
  if (fs < 0 || fsconfig (fs, FSCONFIG_SET_STRING, "source", "sandbox-disk", 0) < 0
      || fsconfig (fs, FSCONFIG_SET_STRING, "size", size, 0) < 0
      || fsconfig (fs, FSCONFIG_SET_STRING, "nr_inodes", inodes, 0) < 0
      || fsconfig (fs, FSCONFIG_SET_STRING, "mode", "0755", 0) < 0 || (o->restore && set_huge (fs, "within_size") < 0)
      || fsconfig (fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
    return err_make_sys (err, errno, "make the disk tmpfs (%s, %s inodes)", size, inodes);
  helper_disk_fd = fsmount (fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
  if (helper_disk_fd < 0)
    return err_make_sys (err, errno, "mount the disk tmpfs");
  return 0;
}

/* The control socket: a listening socket at <state>/ctl, where the gateway
 * connects once per request (it holds no descriptor of it meanwhile). Bound
 * through /proc/self/fd: the state path may be longer than a socket
 * address allows. Made by make_layer, before the holder is forked, which
 * inherits it. */
static int helper_ctl_fd = -1;

static int
listen_ctl (const helper_opts_t *o, int *out, err_t *err)
{
  cleanup_close int dir = open (o->state, O_PATH | O_DIRECTORY | O_CLOEXEC);
  cleanup_close int fd = socket (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (dir < 0 || fd < 0)
    return err_make_sys (err, errno, "the control socket in `%s`", o->state);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf (sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/" SBX_CTL_NAME, dir);
  if (bind (fd, (struct sockaddr *) &sa, sizeof sa) < 0 || listen (fd, 128) < 0)
    return err_make_sys (err, errno, "bind the control socket in `%s`", o->state);
  *out = take_fd (&fd);
  return 0;
}

/* The sandbox's cgroups and its disk, with the snapshot unpacked into it
 * when restoring. 0 ok; 1 the unpacker failed and reported why; -1 *err. */
static int
make_layer (const helper_opts_t *o, sbx_cg_layout_t *cg, err_t *err)
{
  /* The user namespace is made by a child while this does the rest. */
  if (o->uid_range > 0 && helper_userns_start (o, err) < 0)
    return -1;
  if (sbx_cg_detect (o->cgroup_mount, o->cgroup_group, o->limits.cpu_millis > 0 || o->cpu_group, cg, err) < 0
      || sbx_cg_prepare (cg, err) < 0 || sbx_cg_create (cg, o->id, o->memcg_spare, &o->limits, err) < 0)
    return -1;
  /* Entries of the state directory (the host's file system) are made
   * before joining the sandbox's cgroups: the file system's metadata
   * blocks they bring into the page cache are the host's, and a page
   * charged to the sandbox's memory cgroup would keep it alive in the
   * kernel after its removal ("dying", with its statistics and shrinker
   * slots: thousands of them and gigabytes of slab after a few thousand
   * launches) until memory pressure reclaims that page. The directory
   * and its control socket; the sandbox's mounts have their mount points
   * in the base mount namespace's tmpfs (rootfs.c). */
  if (helper_mkdir_p (o->state, 0700, err) < 0)
    return -1;
  if (listen_ctl (o, &helper_ctl_fd, err) < 0)
    return -1;
  /* From here on, what the helper does is the sandbox's: the unpacker it
   * runs (memory, CPU, processes) and the restored bytes it writes into the
   * disk are charged to the sandbox's limits, not the gateway's. */
  if (sbx_cg_join (cg, o->id, NULL, err) < 0)
    return -1;
  if (make_disk (o, err) < 0)
    return -1;
  /* work/ and upper/ of the overlay; dev/ and shm/, bound at /dev and
   * /dev/shm, and empty/, bound read-only over masked directories (no
   * tmpfs of their own: see rootfs.c). */
  static const struct
  {
    const char *name;
    mode_t mode;
    bool owned; /* by the sandbox's root */
  } dirs2[] = {{"work", 0700, false},
               {"upper", 0755, true},
               {"dev", 0755, true},
               {"shm", 01777, true},
               {"empty", 0555, false}};
  for (size_t i = 0; i < sizeof dirs2 / sizeof dirs2[0]; i++)
    {
      if (mkdirat (helper_disk_fd, dirs2[i].name, dirs2[i].mode) < 0
          || fchmodat (helper_disk_fd, dirs2[i].name, dirs2[i].mode, 0) < 0)
        return err_make_sys (err, errno, "make the disk's %s/", dirs2[i].name);
      /* upper/ is the overlay's root: root's inside, as are /dev, /dev/shm. */
      if (dirs2[i].owned && o->uid_range > 0
          && fchownat (helper_disk_fd, dirs2[i].name, (uid_t) o->uid_base, (gid_t) o->uid_base, 0) < 0)
        return err_make_sys (err, errno, "chown the disk's %s/", dirs2[i].name);
    }
  if (o->uid_range > 0 && helper_userns_finish (o, err) < 0)
    return -1;
  if (!o->restore)
    return 0;
  int rc = restore_layer (o, err);
  return rc == 0 && restore_done (err) < 0 ? -1 : rc;
}

/* Keeps the OOM killer off the holder (pid 1: the sandbox ends with it):
 * on cgroup v1 the holder moves out of the sandbox's memory group, into
 * the holders' group (cgroup.h), once its set-up is done, and the
 * processes it starts move back in before they run anything of the
 * sandbox's (holder.c). The OOM killer of the sandbox's limit then only
 * sees the sandbox's own processes, however small they are next to the
 * holder (processes that pin memory in no one's rss: pipes, socket
 * buffers, closed tmpfs files held open). The kernel memory the set-up
 * made (mounts, namespaces) stays charged to the sandbox; after the move
 * only the holder's own pages and the kernel's records of the processes
 * it starts are charged to the holders' group.
 *
 * Called after the set-up, when the holder is inside the sandbox's cgroup
 * namespace (rooted at the sandbox's groups, so its commands see
 * themselves at the root) and user namespace: `holders` was opened by the
 * host's root, which is whom cgroup v1 checks the move against. Closed
 * here: nothing in the sandbox may ever reach it (it would move a process
 * out from under the sandbox's limit). -1: no holders' group (cgroup v2,
 * where a move cannot be per controller; only the detection of a dead
 * holder applies there, see docs/runtime.md). oom_score_adj is no
 * substitute: lowering it takes CAP_SYS_RESOURCE, which a gateway may
 * lack, and every command would inherit the lowered score (a command's
 * own reset would reach the holder too, which shares its memory until the
 * command execs). */
static int
leave_memcg (int holders, err_t *err)
{
  if (holders < 0)
    return 0;
  bool moved = TEMP_FAILURE_RETRY (write (holders, "0", 1)) == 1;
  int saved = errno;
  close (holders);
  if (!moved)
    return err_make_sys (err, saved, "move the sandbox's pid 1 into the holders' memory group");
  return 0;
}

/* In the forked holder: sets the sandbox up, says READY on `sync`, then
 * serves the gateway's requests for the sandbox's life. `lifeline` is a
 * pidfd of the gateway: the sandbox ends with it. */
static void __attribute__ ((noreturn))
holder_main (const helper_opts_t *o, const sbx_cg_layout_t *cg, const sbx_confine_t *confine, int sync, int lifeline)
{
  close (helper_report_fd);
  err_t cerr = ERR_INIT;
  int ctl = helper_ctl_fd;
  /* The moves out of and back into the sandbox's memory group, opened
   * while the host's cgroup tree is in reach (see leave_memcg). */
  int memcg = -1, holders = -1;
  /* The sandbox's pid 1 leads a session of its own: nothing inside shares
   * a session or process group with the helper, the gateway or the shim. */
  if (setsid () < 0)
    err_make_sys (&cerr, errno, "setsid");
  if (cerr.status != 0 || sbx_cg_open_holder_moves (cg, o->id, &memcg, &holders, &cerr) < 0
      || helper_holder_setup (o, cg, &cerr) < 0 || leave_memcg (holders, &cerr) < 0)
    {
      helper_report_err (sync, &cerr);
      _exit (1);
    }
  int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0)
    {
      dup2 (null, 0);
      dup2 (null, 1);
      dup2 (null, 2);
    }
  sbx_report_ready (sync, getpid (), -1);
  close (sync);
  if (helper_args_start != NULL)
    {
      memset (helper_args_start, 0, helper_args_len);
      snprintf (helper_args_start, helper_args_len, "sandbox-init");
    }
  /* fd 3: the control socket; fd 4: the lifeline; fd 5: the sandbox's
   * memory group, where the holder puts every process it starts (none on
   * cgroup v2). By way of high numbers: any may already be 3, 4 or 5, and
   * dup3 refuses a descriptor onto itself. */
  int c = fcntl (ctl, F_DUPFD_CLOEXEC, 16), l = fcntl (lifeline, F_DUPFD_CLOEXEC, 16);
  int m = memcg >= 0 ? fcntl (memcg, F_DUPFD_CLOEXEC, 16) : -1;
  if (c < 0 || l < 0 || (memcg >= 0 && m < 0) || dup3 (c, 3, O_CLOEXEC) < 0 || dup3 (l, 4, O_CLOEXEC) < 0
      || (m >= 0 && dup3 (m, 5, O_CLOEXEC) < 0))
    _exit (1);
  syscall (SYS_close_range, m >= 0 ? 6 : 5, ~0U, 0);
  helper_holder_loop (3, 4, m >= 0 ? 5 : -1, confine);
}

/* Waits for the holder's word and hands the sandbox's disk to the gateway.
 * 0 ok; 1 the holder failed and that was reported; -1 with *err. */
static int
hand_over (pid_t *pid, int sync, err_t *err)
{
  sbx_report_t r;
  memset (&r, 0, sizeof r);
  ssize_t n = TEMP_FAILURE_RETRY (recv (sync, &r, sizeof r, 0));
  if (n != (ssize_t) sizeof r)
    {
      int status = 0;
      waitpid (take_pid (pid), &status, 0);
      return err_make (err, ECHILD, "the sandbox's pid 1 died during set-up (status %d)", status);
    }
  if (r.type != SBX_REPORT_READY)
    {
      sbx_report_error (helper_report_fd, r.status, r.text);
      return 1; /* *pid is killed and reaped by the caller's scope */
    }
  if (sbx_report_ready (helper_report_fd, *pid, helper_disk_fd) < 0)
    return err_make_sys (err, errno, "hand the disk over");
  take_pid (pid); /* the sandbox lives on: the gateway adopts it */
  return 0;
}

int
helper_filter (bool deny_setid)
{
  err_t err = ERR_INIT;
  cleanup_close int fd = sbx_confine_export (deny_setid, &err);
  return helper_answer (&err, fd);
}

/* Forks the holder as pid 1 of a new pid namespace. Same returns as
 * hand_over. */
static int
start_holder (const helper_opts_t *o, const sbx_cg_layout_t *cg, err_t *err)
{
  cleanup_pipe int sync[2] = {-1, -1};
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) < 0)
    return err_make_sys (err, errno, "socketpair");
  /* The gateway, this program's parent: the holder watches it. */
  cleanup_close int lifeline = (int) syscall (SYS_pidfd_open, getppid (), 0);
  if (lifeline < 0)
    return err_make_sys (err, errno, "pidfd_open the gateway");
  /* The filter the gateway compiled once, when it started. */
  sbx_confine_t confine;
  int loaded = sbx_confine_load (&confine, SBX_FILTER_FD, err);
  close (SBX_FILTER_FD);
  if (loaded < 0)
    return -1;
  if (unshare (CLONE_NEWPID) < 0)
    return err_make_sys (err, errno, "unshare the pid namespace");
  /* Killed and reaped when this scope ends, unless handed over. */
  cleanup_pid pid_t pid = fork ();
  if (pid < 0)
    return err_make_sys (err, errno, "fork the holder");
  if (pid == 0)
    {
      close (take_fd (&sync[0]));
      holder_main (o, cg, &confine, sync[1], lifeline);
    }
  close (take_fd (&sync[1]));
  return hand_over (&pid, sync[0], err);
}

int
helper_launch (const helper_opts_t *o)
{
  cleanup_err err_t err = ERR_INIT;
  sbx_cg_layout_t cg;
  int rc = make_layer (o, &cg, &err);
  if (rc == 0)
    rc = start_holder (o, &cg, &err);
  helper_userns_reap ();
  if (rc < 0)
    {
      helper_report_err (helper_report_fd, &err);
    }
  return rc == 0 ? 0 : 1;
}
