/* helper/launch: making a sandbox — its cgroups, its disk (a size-limited
 * tmpfs holding the overlay's upper and work directories), the snapshot
 * unpacked into it when restoring (sandbox-unpack), then the holder forked
 * into a new pid namespace; READY with the holder's pid and control socket
 * goes to the gateway, or ERROR. Single-threaded. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/helper.h"

/* Unpacks stdin into <disk>/upper with sandbox-unpack, which chroots there
 * first; with a user namespace, it runs inside it as the sandbox's root.
 * 0 ok; 1 it failed and reported why; -1 with *err. */
static int
restore_layer (const helper_opts_t *o, const char *upper, err_t *err)
{
  char max[24];
  snprintf (max, sizeof max, "%ld", o->max_entries);
  /* Opened here, as the host's root: the sandbox's root may not be able
   * to reach either through the host's directories. */
  cleanup_close int dir = open (upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  cleanup_close int exe = open (o->unpacker, O_RDONLY | O_CLOEXEC);
  if (dir < 0 || exe < 0)
    return err_make_sys (err, errno, "open `%s`", dir < 0 ? upper : o->unpacker);
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
        err_make_sys (&cerr, errno, "enter `%s`", upper);
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

/* The sandbox's cgroups and its disk, with the snapshot unpacked into it
 * when restoring. 0 ok; 1 the unpacker failed and reported why; -1 *err. */
static int
make_layer (const helper_opts_t *o, sbx_cg_layout_t *cg, err_t *err)
{
  /* The user namespace is made by a child while this does the rest. */
  if (o->uid_range > 0 && helper_userns_start (o, err) < 0)
    return -1;
  if (sbx_cg_detect (o->cgroup_mount, o->cgroup_group, o->limits.cpu_millis > 0, cg, err) < 0
      || sbx_cg_prepare (cg, err) < 0 || sbx_cg_create (cg, o->id, &o->limits, err) < 0)
    return -1;
  /* From here on, what the helper does is the sandbox's: the unpacker it
   * runs (memory, CPU, processes) and the restored bytes it writes into the
   * disk are charged to the sandbox's limits, not the gateway's. */
  if (sbx_cg_join (cg, o->id, NULL, err) < 0)
    return -1;
  char disk[PATH_MAX], path[PATH_MAX * 2], mopts[128];
  snprintf (disk, sizeof disk, "%s/disk", o->state);
  snprintf (path, sizeof path, "%s/root", o->state);
  if (helper_mkdir_p (disk, 0700, err) < 0 || helper_mkdir_p (path, 0755, err) < 0)
    return -1;
  if (o->uid_range > 0)
    {
      /* Where the idmapped image is attached, in the holder's mounts only. */
      snprintf (path, sizeof path, "%s/lower", o->state);
      if (mkdir (path, 0700) < 0)
        return err_make_sys (err, errno, "mkdir `%s`", path);
    }
  snprintf (mopts, sizeof mopts, "size=%ldm,nr_inodes=%ld,mode=0755", o->disk_mb, o->disk_inodes);
  if (mount ("sandbox-disk", disk, "tmpfs", MS_NOSUID | MS_NODEV, mopts) < 0)
    return err_make_sys (err, errno, "mount the disk tmpfs on `%s`", disk);
  snprintf (path, sizeof path, "%s/work", disk);
  if (mkdir (path, 0700) < 0)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  snprintf (path, sizeof path, "%s/upper", disk);
  if (mkdir (path, 0755) < 0)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  /* The overlay's root is the upper directory's inode: root's inside. */
  if (o->uid_range > 0 && chown (path, (uid_t) o->uid_base, (gid_t) o->uid_base) < 0)
    return err_make_sys (err, errno, "chown `%s`", path);
  if (o->uid_range > 0 && helper_userns_finish (o, err) < 0)
    return -1;
  return o->restore ? restore_layer (o, path, err) : 0;
}

/* In the forked holder: sets the sandbox up, says READY on `sync`, then
 * serves exec requests on `ctl` for the sandbox's life. */
static void __attribute__ ((noreturn))
holder_main (const helper_opts_t *o, const sbx_cg_layout_t *cg, const sbx_confine_t *confine, int sync, int ctl)
{
  close (helper_report_fd);
  err_t cerr = ERR_INIT;
  /* The sandbox's pid 1 leads a session of its own: nothing inside shares
   * a session or process group with the helper, the gateway or the shim. */
  if (setsid () < 0)
    err_make_sys (&cerr, errno, "setsid");
  if (cerr.status != 0 || helper_holder_setup (o, cg, &cerr) < 0)
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
  helper_report (sync, SBX_REPORT_READY, 0, 1, 0, NULL);
  close (sync);
  if (helper_args_start != NULL)
    {
      memset (helper_args_start, 0, helper_args_len);
      snprintf (helper_args_start, helper_args_len, "sandbox-init");
    }
  if (ctl != 3)
    {
      dup2 (ctl, 3);
      close (ctl);
    }
  syscall (SYS_close_range, 4, ~0U, 0);
  helper_holder_loop (3, confine);
}

/* Waits for the holder's word and hands its control socket to the gateway.
 * 0 ok; 1 the holder failed and that was reported; -1 with *err. */
static int
hand_over (pid_t *pid, int sync, int ctl, err_t *err)
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
      helper_report (helper_report_fd, SBX_REPORT_ERROR, r.status, 0, 0, r.text);
      return 1; /* *pid is killed and reaped by the caller's scope */
    }
  sbx_report_t ready;
  memset (&ready, 0, sizeof ready);
  ready.type = SBX_REPORT_READY;
  ready.a = *pid;
  if (sbx_send_fds (helper_report_fd, &ready, sizeof ready, &ctl, 1) < 0)
    return err_make_sys (err, errno, "hand the control socket over");
  take_pid (pid); /* the sandbox lives on: the gateway adopts it */
  return 0;
}

/* Forks the holder as pid 1 of a new pid namespace. Same returns as
 * hand_over. */
static int
start_holder (const helper_opts_t *o, const sbx_cg_layout_t *cg, err_t *err)
{
  cleanup_pipe int sync[2] = {-1, -1}, ctl[2] = {-1, -1};
  if (socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) < 0
      || socketpair (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0)
    return err_make_sys (err, errno, "socketpair");
  sbx_confine_t confine;
  if (sbx_confine_prepare (&confine, err) < 0)
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
      close (take_fd (&ctl[0]));
      holder_main (o, cg, &confine, sync[1], ctl[1]);
    }
  close (take_fd (&sync[1]));
  close (take_fd (&ctl[1]));
  return hand_over (&pid, sync[0], ctl[0], err);
}

int
helper_launch (const helper_opts_t *o)
{
  err_t err = ERR_INIT;
  sbx_cg_layout_t cg;
  int rc = make_layer (o, &cg, &err);
  if (rc == 0)
    rc = start_holder (o, &cg, &err);
  helper_userns_reap ();
  if (rc < 0)
    {
      helper_report_err (helper_report_fd, &err);
      err_release (&err);
    }
  return rc == 0 ? 0 : 1;
}
