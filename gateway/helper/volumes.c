/* helper/volumes: a host volume as the gateway checked it
 * ("host:sandbox[:ro][:uid=N:gid=M]") and its detached, idmapped copy made
 * from the gateway's descriptor of its host path (see helper.h). Called by
 * the single-threaded helper while it sets a sandbox's root up (rootfs.c
 * mounts the copies). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
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
#include <sys/xattr.h>
#include <unistd.h>
#include "common/cleanup.h"
#include "gateway/helper/helper.h"
#include "gateway/runtime/path.h"

/* A user namespace whose only ids are `uid`/`gid`, standing for host ids
 * `root_id`: idmapping a mount through it makes what host id root_id (the
 * sandbox's root) writes there land as uid/gid on the host, and shows
 * uid/gid's files as root's. Every other id is unmapped: nobody inside,
 * refused on writes. Into *out. */
int
helper_owner_userns (long uid, long gid, unsigned long root_id, unsigned long count, int *out, err_t *err)
{
  cleanup_pipe int p[2] = {-1, -1};
  if (pipe2 (p, O_CLOEXEC) < 0)
    return err_make_sys (err, errno, "pipe");
  pid_t pid = fork ();
  if (pid < 0)
    return err_make_sys (err, errno, "fork");
  if (pid == 0)
    {
      /* Its pid as /proc (the host's) names it: this may run in a pid
       * namespace of its own (the holder's), where fork's answer is not. */
      char self[32] = "";
      int host_pid
          = unshare (CLONE_NEWUSER) == 0 && readlink ("/proc/self", self, sizeof self - 1) > 0 ? atoi (self) : -1;
      close (p[0]);
      (void) !write (p[1], &host_pid, sizeof host_pid);
      (void) !read (p[1], self, 1); /* EOF once the parent is done */
      _exit (0);
    }
  char path[64], map[96];
  int rc = 0, host_pid = -1;
  close (take_fd (&p[1]));
  if (TEMP_FAILURE_RETRY (read (p[0], &host_pid, sizeof host_pid)) != (ssize_t) sizeof host_pid || host_pid <= 0)
    rc = err_make (err, EPERM, "make a user namespace for a volume's owner");
  const char *files[] = {"uid_map", "gid_map"};
  for (int i = 0; i < 2 && rc == 0; i++)
    {
      snprintf (path, sizeof path, "/proc/%d/%s", host_pid, files[i]);
      int len = helper_id_map_line (map, sizeof map, i == 0 ? uid : gid, root_id, count);
      cleanup_close int fd = len < 0 ? -1 : open (path, O_WRONLY | O_CLOEXEC);
      if (len < 0)
        rc = err_make (err, ENAMETOOLONG, "the %s line does not fit %zu bytes", files[i], sizeof map);
      else if (fd < 0 || write (fd, map, (size_t) len) != len)
        rc = err_make_sys (err, errno, "write %s `%s`", files[i], map);
    }
  snprintf (path, sizeof path, "/proc/%d/ns/user", host_pid);
  if (rc == 0 && (*out = open (path, O_RDONLY | O_CLOEXEC)) < 0)
    rc = err_make_sys (err, errno, "open `%s`", path);
  kill (pid, SIGKILL);
  while (waitpid (pid, NULL, 0) < 0 && errno == EINTR)
    ;
  return rc;
}

int
helper_volume_clone (const helper_volume_t *v, int fd, unsigned long root_id, int *out, err_t *err)
{
  struct stat st;
  if (fstat (fd, &st) < 0)
    return err_make_sys (err, errno, "volume `%s`: the gateway's descriptor", v->host);
  if (!S_ISDIR (st.st_mode) && !S_ISREG (st.st_mode))
    return err_make (err, ENOTDIR, "volume `%s` is no longer a directory or a file", v->host);
  cleanup_close int tree = open_tree (fd, "", AT_EMPTY_PATH | OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
  if (tree < 0)
    return err_make_sys (err, errno, "volume `%s`: clone its tree", v->host);
  cleanup_close int map = -1;
  if (v->uid >= 0 && helper_owner_userns (v->uid, v->gid, root_id, 1, &map, err) < 0)
    return err_wrap (err, "volume `%s`", v->host);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (v->ro ? MOUNT_ATTR_RDONLY : 0)};
  if (map >= 0)
    {
      attr.attr_set |= MOUNT_ATTR_IDMAP;
      attr.userns_fd = (uint64_t) map;
    }
  if (mount_setattr (tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0)
    return err_make_sys (err, errno, "volume `%s`: set nosuid, nodev%s%s", v->host, v->ro ? ", read-only" : "",
                         map >= 0 ? ", idmapped to its owner" : "");
  *out = take_fd (&tree);
  return 0;
}
