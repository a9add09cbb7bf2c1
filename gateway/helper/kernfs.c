/* helper/kernfs: the kernel's file systems in a sandbox's root, made by
 * its pid 1 (rootfs.c) — /dev from the sandbox's disk with the host's
 * harmless nodes and a private devpts, /proc read-only where it reaches
 * the host kernel with its leakiest files masked, and the masked paths of
 * the options. Single-threaded, as rootfs.c. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/rootfs.h"
#include "gateway/runtime/path.h"

const char *const helper_dev_nodes[N_DEV_NODES] = {"null", "zero", "full", "random", "urandom", "tty"};

static int
bind_node (const char *root, const char *name, int src_fd, err_t *err)
{
  char dst[PATH_MAX * 2];
  if (sbx_path_fmt (dst, sizeof dst, err, "%s/dev/%s", root, name) < 0)
    return -1;
  cleanup_close int fd = open (dst, O_CREAT | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0)
    return err_make_sys (err, errno, "create `%s`", dst);
  if (move_mount (src_fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return err_make_sys (err, errno, "bind /dev/%s on `%s`", name, dst);
  return 0;
}

/* Covers directory `path` with a read-only clone of the empty directory. */
static int
mask_dir (const host_refs_t *refs, const char *path, err_t *err)
{
  cleanup_close int fd = open_tree (refs->empty, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (fd < 0 || move_mount (fd, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return err_make_sys (err, errno, "mask `%s`", path);
  return 0;
}

int
rootfs_setup_dev (const char *root, const host_refs_t *refs, err_t *err)
{
  char path[PATH_MAX * 2];
  /* /dev and /dev/shm are directories of the sandbox's disk (its quota,
   * owned by its root), bound nosuid,noexec and nosuid,nodev. */
  if (sbx_path_fmt (path, sizeof path, err, "%s/dev", root) < 0)
    return -1;
  if (helper_mkdir_p (path, 0755, err) < 0)
    return -1;
  if (move_mount (refs->dev_dir, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return err_make_sys (err, errno, "bind the disk's dev/ on `%s`", path);
  for (size_t i = 0; i < N_DEV_NODES; i++)
    if (bind_node (root, helper_dev_nodes[i], refs->dev_nodes[i], err) < 0)
      return -1;
  if (sbx_path_fmt (path, sizeof path, err, "%s/dev/pts", root) < 0)
    return -1;
  if (mkdir (path, 0755) < 0)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  if (mount ("devpts", path, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") < 0)
    return err_make_sys (err, errno, "mount devpts on `%s`", path);
  if (sbx_path_fmt (path, sizeof path, err, "%s/dev/shm", root) < 0)
    return -1;
  if (mkdir (path, 01777) < 0)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  if (move_mount (refs->shm_dir, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return err_make_sys (err, errno, "bind the disk's shm/ on `%s`", path);
  static const char *const links[][2] = {
      {"pts/ptmx", "ptmx"},          {"/proc/self/fd", "fd"},       {"/proc/self/fd/0", "stdin"},
      {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
  };
  for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
    {
      if (sbx_path_fmt (path, sizeof path, err, "%s/dev/%s", root, links[i][1]) < 0)
        return -1;
      if (symlink (links[i][0], path) < 0)
        return err_make_sys (err, errno, "symlink `%s`", path);
    }
  return 0;
}

/* With a user namespace, root inside has no capability over the network
 * namespace (the host's root owns it): let every uid bind low ports there,
 * as root inside could before. Per network namespace; through the
 * sandbox's own /proc before its sys/ turns read-only (a container's /proc
 * may have it read-only from the start). */
static int
allow_low_ports (const char *root, err_t *err)
{
  char path[PATH_MAX * 2];
  if (sbx_path_fmt (path, sizeof path, err, "%s/proc/sys/net/ipv4/ip_unprivileged_port_start", root) < 0)
    return -1;
  cleanup_close int fd = open (path, O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write (fd, "0", 1) != 1)
    return err_make_sys (err, errno, "set ip_unprivileged_port_start in the sandbox's network namespace");
  return 0;
}

/* /proc as Docker leaves it: the kernel's knobs read-only, the leakiest
 * files masked. The sandbox's root has no CAP_SYS_ADMIN and no mount(2), so
 * it cannot undo this. */
int
rootfs_setup_proc (const helper_opts_t *o, const char *root, const host_refs_t *refs, err_t *err)
{
  char path[PATH_MAX * 2];
  if (sbx_path_fmt (path, sizeof path, err, "%s/proc", root) < 0)
    return -1;
  if (helper_mkdir_p (path, 0555, err) < 0)
    return -1;
  if (mount ("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
    return err_make_sys (err, errno, "mount proc on `%s`", path);
  if (o->uid_range > 0 && allow_low_ports (root, err) < 0)
    return -1;
  static const char *const readonly[] = {"sys", "sysrq-trigger", "irq", "bus", "fs"};
  for (size_t i = 0; i < sizeof readonly / sizeof readonly[0]; i++)
    {
      if (sbx_path_fmt (path, sizeof path, err, "%s/proc/%s", root, readonly[i]) < 0)
        return -1;
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
      if (sbx_path_fmt (path, sizeof path, err, "%s/proc/%s", root, masked_files[i]) < 0)
        return -1;
      if (access (path, F_OK) != 0)
        continue;
      if (mount ("/dev/null", path, NULL, MS_BIND, NULL) < 0)
        return err_make_sys (err, errno, "mask `%s`", path);
    }
  static const char *const masked_dirs[] = {"acpi", "scsi"};
  for (size_t i = 0; i < sizeof masked_dirs / sizeof masked_dirs[0]; i++)
    {
      if (sbx_path_fmt (path, sizeof path, err, "%s/proc/%s", root, masked_dirs[i]) < 0)
        return -1;
      if (access (path, F_OK) != 0)
        continue;
      if (mask_dir (refs, path, err) < 0)
        return -1;
    }
  return 0;
}

int
rootfs_mask_paths (const helper_opts_t *o, const char *root, const host_refs_t *refs, err_t *err)
{
  for (size_t i = 0; i < o->n_masks; i++)
    {
      char path[PATH_MAX * 2];
      if (sbx_path_fmt (path, sizeof path, err, "%s%s", root, o->masks[i]) < 0)
        return -1;
      struct stat st;
      if (lstat (path, &st) < 0)
        continue; /* not in the image */
      if (S_ISDIR (st.st_mode) ? mask_dir (refs, path, err) < 0 : mount ("/dev/null", path, NULL, MS_BIND, NULL) < 0)
        return err->status != 0 ? -1 : err_make_sys (err, errno, "mask `%s`", o->masks[i]);
    }
  return 0;
}
