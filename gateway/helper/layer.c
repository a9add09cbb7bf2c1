/* helper/layer: `sandbox-helper unpack-layer`, an image layer (a verified
 * blob on stdin) unpacked into a new, empty layer directory by
 * sandbox-unpack, run unprivileged: in a user namespace of its own whose
 * ids 0..65535 are host ids --layer-uid.., so every file it makes is owned
 * by that unprivileged host range (a setuid file of the image is setuid to
 * an unprivileged host uid, never to host root) and it has no power over
 * anything of the host's. sandbox-unpack then chroots into the directory
 * and confines itself (capabilities, no_new_privs, seccomp) as for a
 * restore. The overlay of a sandbox on the image shows the range as its
 * own ids through an idmapped mount (rootfs.c). Single-threaded. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/helper.h"

extern char **environ;

/* Writes "0 owner 65536" as the uid and gid map of `pid`'s user namespace. */
static int
map_layer_ids (pid_t pid, unsigned long owner, err_t *err)
{
  const char *files[] = {"uid_map", "gid_map"};
  for (int i = 0; i < 2; i++)
    {
      char path[64], map[64];
      snprintf (path, sizeof path, "/proc/%d/%s", (int) pid, files[i]);
      int len = snprintf (map, sizeof map, "0 %lu %d\n", owner, HELPER_LAYER_IDS);
      cleanup_close int fd = open (path, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || write (fd, map, (size_t) len) != len)
        return err_make_sys (err, errno, "write %s `%s`", files[i], map);
    }
  return 0;
}

/* The child: a new user namespace, its ids once the parent has mapped
 * them, then sandbox-unpack. Never returns. */
static void
unpacker_child (const helper_opts_t *o, int exe, int dir, int sync_fd)
{
  err_t err = ERR_INIT;
  char max[24], max_mb[40], go = 0;
  snprintf (max, sizeof max, "%ld", o->max_entries);
  snprintf (max_mb, sizeof max_mb, "max-mb=%ld", o->max_mb);
  char *const argv[] = {(char *) "sandbox-unpack", (char *) ".", max, (char *) "userxattr", max_mb, NULL};
  /* Entered as the host's root: the layer's owner cannot walk the
   * cache's directories to it. */
  if (fchdir (dir) < 0)
    err_make_sys (&err, errno, "enter the new layer `%s`", o->state);
  else if (unshare (CLONE_NEWUSER) < 0)
    err_make_sys (&err, errno, "a user namespace for the layer");
  else if (write (sync_fd, "u", 1) != 1 || read (sync_fd, &go, 1) != 1 || go != 'g')
    err_make (&err, EIO, "the layer's ids were not mapped");
  else if (setgroups (0, NULL) < 0 || setresgid (0, 0, 0) < 0 || setresuid (0, 0, 0) < 0)
    err_make_sys (&err, errno, "become the layer's owner");
  else
    {
      fcntl (helper_report_fd, F_SETFD, 0); /* the unpacker reports on fd 3 */
      execveat (exe, "", argv, environ, AT_EMPTY_PATH);
      err_make_sys (&err, errno, "exec `%s`", o->unpacker);
    }
  helper_report_err (helper_report_fd, &err);
  _exit (1);
}

int
helper_unpack_layer (const helper_opts_t *o)
{
  err_t err = ERR_INIT;
  if (o->unpacker == NULL || o->layer_uid == 0)
    {
      err_make (&err, EINVAL, "unpack-layer needs --unpacker and --layer-uid");
      return helper_answer (&err, -1);
    }
  cleanup_close int exe = open (o->unpacker, O_RDONLY | O_CLOEXEC);
  cleanup_close int dir = open (o->state, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int sp[2] = {-1, -1};
  if (exe < 0 || dir < 0 || socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
    {
      err_make_sys (&err, errno, "open `%s`", exe < 0 ? o->unpacker : o->state);
      return helper_answer (&err, -1);
    }
  pid_t pid = fork ();
  if (pid == 0)
    {
      close (sp[0]);
      unpacker_child (o, exe, dir, sp[1]);
    }
  close (sp[1]);
  char ready = 0;
  int rc = 0;
  if (pid < 0)
    rc = err_make_sys (&err, errno, "fork the unpacker");
  else if (TEMP_FAILURE_RETRY (read (sp[0], &ready, 1)) == 1 && map_layer_ids (pid, o->layer_uid, &err) == 0)
    (void) !write (sp[0], "g", 1);
  else
    rc = -1;
  close (sp[0]);
  int status = 0;
  while (pid > 0 && waitpid (pid, &status, 0) < 0 && errno == EINTR)
    ;
  if (rc < 0 && err.status != 0)
    return helper_answer (&err, -1);
  if (pid > 0 && WIFEXITED (status) && WEXITSTATUS (status) == 0)
    {
      sbx_report_ready (helper_report_fd, 0, -1);
      return 0;
    }
  if (pid > 0 && WIFEXITED (status) && WEXITSTATUS (status) == 1)
    return 1; /* it reported why */
  err_make (&err, EIO, "the layer's unpacker died (status %d)", status);
  return helper_answer (&err, -1);
}
