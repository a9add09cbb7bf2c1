/* helper/rootfs: the sandbox's root, made by its pid 1 before anything of
 * the sandbox runs — new mount, network, ipc, uts and cgroup namespaces, the
 * overlay of the image under the sandbox's upper layer, a fresh /proc, a
 * minimal /dev, masked host paths, volumes, resolv.conf for egress, then
 * pivot_root. Single-threaded (the helper, then the holder). */
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
#include <sys/xattr.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/helper/helper.h"

int
helper_mkdir_p (const char *path, mode_t mode, err_t *err)
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
  if (helper_mkdir_p (path, 0755, err) < 0)
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
  if (helper_mkdir_p (path, 0555, err) < 0)
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
          if (helper_mkdir_p (target, 0755, err) < 0)
            return -1;
        }
      else
        {
          char parent[PATH_MAX];
          snprintf (parent, sizeof parent, "%s", target);
          *strrchr (parent, '/') = '\0';
          if (helper_mkdir_p (parent, 0755, err) < 0)
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
  if (helper_mkdir_p (path, 0755, err) < 0)
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
int
helper_holder_setup (const helper_opts_t *o, const sbx_cg_layout_t *cg, err_t *err)
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
  if (helper_mkdir_p (path, 0700, err) < 0)
    return -1;
  snprintf (path, sizeof path, "%s/tmp", root);
  if (helper_mkdir_p (path, 01777, err) < 0)
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
  if (helper_loopback_up (err) < 0)
    return -1;
  return o->egress ? helper_block_egress_routes (o, err) : 0;
}
