/* helper/rootfs: the sandbox's root, made by its pid 1 before anything of
 * the sandbox runs — new mount, network, ipc, uts and cgroup namespaces, the
 * overlay of the image under the sandbox's upper layer, a fresh /proc, a
 * minimal /dev, masked host paths, volumes, resolv.conf for egress, all
 * made in a copy of the base mount namespace (helper_base), which holds
 * nothing of the host's. Single-threaded (the helper, then the holder). */
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
#include "gateway/helper/rootfs.h"
#include "gateway/runtime/path.h"

/* Where the base mount namespace's empty root has the sandbox's disk, its
 * image and its overlay attached while the root is made (helper_base). */
#define BASE_DISK "/disk"
#define BASE_LOWER "/lower"
#define BASE_ROOT "/root"

static void
host_refs_release (host_refs_t *refs, size_t n_volumes)
{
  for (size_t i = 0; i < N_DEV_NODES; i++)
    if (refs->dev_nodes[i] > 0)
      close (refs->dev_nodes[i]);
  int own[] = {refs->lower, refs->dev_dir, refs->shm_dir, refs->empty};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (own[i] > 0)
      close (own[i]);
  for (size_t i = 0; i < refs->n_layers; i++)
    if (refs->layers[i] > 0)
      close (refs->layers[i]);
  for (size_t i = 0; refs->volumes != NULL && i < n_volumes; i++)
    if (refs->volumes[i] >= 0)
      close (refs->volumes[i]);
  free (refs->volumes);
}

int
helper_mkdir_p (const char *path, mode_t mode, err_t *err)
{
  char buf[PATH_MAX];
  if (sbx_path_fmt (buf, sizeof buf, err, "%s", path) < 0)
    return -1;
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

/* Resolution inside the sandbox's root (the caller's root, after
 * enter_root): a link the sandbox planted resolves inside it, and never
 * through /proc's magic links (/proc/self/fd/N would lead to a host tree
 * this process still holds, as host root). */
static int
open_in_root (int dir, const char *path, int flags, mode_t mode)
{
  struct open_how how = {.flags = (uint64_t) (flags | O_CLOEXEC),
                         .mode = (flags & O_CREAT) ? mode : 0,
                         .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
  return (int) syscall (SYS_openat2, dir, path, &how, sizeof how);
}

/* The directory `path` of the sandbox's root, made with its parents where
 * missing (`mode`), resolved as open_in_root does: an O_PATH descriptor of
 * it in *out. */
static int
mkdir_in_root (const char *path, mode_t mode, int *out, err_t *err)
{
  cleanup_close int dir = open ("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0)
    return err_make_sys (err, errno, "open the sandbox's root");
  char buf[PATH_MAX];
  if (sbx_path_fmt (buf, sizeof buf, err, "%s", path) < 0)
    return -1;
  char *save = NULL;
  for (char *name = strtok_r (buf, "/", &save); name != NULL; name = strtok_r (NULL, "/", &save))
    {
      int next = open_in_root (dir, name, O_PATH | O_DIRECTORY, 0);
      if (next < 0 && errno == ENOENT)
        {
          if (mkdirat (dir, name, mode) < 0 && errno != EEXIST)
            return err_make_sys (err, errno, "mkdir `%s` (in `%s`)", name, path);
          next = open_in_root (dir, name, O_PATH | O_DIRECTORY, 0);
        }
      if (next < 0)
        return err_make_sys (err, errno, "`%s` of `%s`", name, path);
      close (dir);
      dir = next;
    }
  *out = take_fd (&dir);
  return 0;
}

/* On the host: a detached copy of each volume's tree, from the gateway's
 * descriptors (never its path, which a sandbox may have changed), each
 * closed once cloned. Without an owner a volume is not idmapped: what a
 * sandbox writes there is owned by its own host ids, never host root's. */
static int
capture_volumes (const helper_opts_t *o, host_refs_t *refs, err_t *err)
{
  unsigned long root_id = o->uid_range > 0 ? o->uid_base : 0;
  for (size_t i = 0; i < o->n_volumes; i++)
    {
      helper_volume_t v;
      helper_parse_volume (o->volumes[i], &v);
      int rc = helper_volume_clone (&v, SBX_VOLUME_FD0 + (int) i, root_id, &refs->volumes[i], err);
      close (SBX_VOLUME_FD0 + (int) i);
      if (rc < 0)
        return -1;
    }
  return 0;
}

/* In the sandbox's root: each volume's mount point, made in its own
 * view (its symlinks resolve inside it), and the captured tree moved there. */
static int
attach_volumes (const helper_opts_t *o, const host_refs_t *refs, err_t *err)
{
  for (size_t i = 0; i < o->n_volumes; i++)
    {
      helper_volume_t v;
      helper_parse_volume (o->volumes[i], &v);
      const char *host = v.host, *dst = v.dst;
      struct stat st;
      if (fstat (refs->volumes[i], &st) < 0)
        return err_make_sys (err, errno, "volume `%s`", host);
      /* The mount point, resolved in the sandbox's own view. */
      cleanup_close int point = -1;
      if (S_ISDIR (st.st_mode))
        {
          if (mkdir_in_root (dst, 0755, &point, err) < 0)
            return err_wrap (err, "volume mount point");
        }
      else
        {
          char parent[PATH_MAX];
          if (sbx_path_fmt (parent, sizeof parent, err, "%s", dst) < 0)
            return -1;
          char *name = strrchr (parent, '/');
          *name++ = '\0';
          cleanup_close int pdir = -1;
          if (mkdir_in_root (parent, 0755, &pdir, err) < 0)
            return err_wrap (err, "volume mount point");
          cleanup_close int dirfd = open_in_root (pdir, ".", O_RDONLY | O_DIRECTORY, 0);
          if (dirfd >= 0)
            {
              cleanup_close int made = open_in_root (dirfd, name, O_CREAT | O_WRONLY | O_NOFOLLOW, 0644);
            }
          point = open_in_root (pdir, name, O_PATH | O_NOFOLLOW, 0);
          if (point < 0)
            return err_make_sys (err, errno, "volume mount point `%s`", dst);
        }
      if (move_mount (refs->volumes[i], "", point, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
        return err_make_sys (err, errno, "bind `%s` on `%s`", host, dst);
    }
  return 0;
}

/* Egress sandboxes resolve names through slirp4netns's DNS forwarder. */
/* In the sandbox's root: the egress resolver in /etc/resolv.conf. Best effort:
 * a sandbox that broke its own /etc (a symlink loop, a file) only loses
 * name resolution. */
static void
write_resolv_conf (void)
{
  err_t err = ERR_INIT;
  if (helper_mkdir_p ("/etc", 0755, &err) < 0)
    {
      err_release (&err);
      return;
    }
  unlink ("/etc/resolv.conf");
  cleanup_close int fd = open ("/etc/resolv.conf", O_CREAT | O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  static const char text[] = "nameserver 10.0.2.3\n";
  if (fd >= 0 && write (fd, text, sizeof text - 1) < 0)
    return;
}

/* A clone of the disk's directory `name` with the given attributes. */
static int
clone_disk_dir (const char *name, unsigned long attr_set, int *out, err_t *err)
{
  char path[PATH_MAX];
  if (sbx_path_fmt (path, sizeof path, err, BASE_DISK "/%s", name) < 0)
    return -1;
  *out = open_tree (AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  struct mount_attr attr = {.attr_set = attr_set};
  if (*out < 0 || mount_setattr (*out, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
    return err_make_sys (err, errno, "clone `%s`", path);
  return 0;
}

/* With the disk attached: the sandbox's own /dev and /dev/shm and the empty
 * directory for masks, all directories of its disk. */
static int
capture_own (host_refs_t *refs, err_t *err)
{
  if (clone_disk_dir ("dev", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, &refs->dev_dir, err) < 0
      || clone_disk_dir ("shm", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, &refs->shm_dir, err) < 0)
    return -1;
  return clone_disk_dir ("empty", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                         &refs->empty, err);
}

/* An image's layers (o->layers), each a read-only detached clone whose
 * owner range shows as the sandbox's own ids 0..65535. */
static int
capture_layers (const helper_opts_t *o, host_refs_t *refs, err_t *err)
{
  if (o->uid_range == 0)
    return err_make (err, EINVAL, "an image needs sandboxes in user namespaces (SANDBOX_USERNS=true)");
  cleanup_close int map = -1;
  if (helper_owner_userns ((long) o->layer_uid, (long) o->layer_uid, o->uid_base, HELPER_LAYER_IDS, &map, err) < 0)
    return err_wrap (err, "the image's layers");
  cleanup_free char *list = strdup (o->layers);
  if (list == NULL)
    return err_make (err, ENOMEM, "out of memory");
  char *save = NULL;
  for (char *dir = strtok_r (list, ":", &save); dir != NULL; dir = strtok_r (NULL, ":", &save))
    {
      if (refs->n_layers >= HELPER_MAX_LAYERS)
        return err_make (err, E2BIG, "an image of more than %d layers", HELPER_MAX_LAYERS);
      cleanup_close int fd = open_tree (AT_FDCWD, dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
      if (fd < 0)
        return err_make_sys (err, errno, "clone the layer `%s`", dir);
      struct mount_attr attr
          = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
             .userns_fd = (uint64_t) map};
      if (mount_setattr (fd, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
        return err_make_sys (err, errno, "idmap the layer `%s`", dir);
      refs->layers[refs->n_layers++] = take_fd (&fd);
    }
  if (refs->n_layers == 0)
    return err_make (err, EINVAL, "an image without layers");
  return 0;
}

/* On the host: what the sandbox's root needs from it, as detached mounts
 * (the base's copy has none of the host's tree). The image is cloned
 * alone, not its sub-mounts: an overlay's layer never showed them. */
static int
capture_host (const helper_opts_t *o, host_refs_t *refs, err_t *err)
{
  if (o->layers != NULL)
    {
      if (capture_layers (o, refs, err) < 0)
        return -1;
    }
  else if (o->uid_range > 0)
    {
      if (helper_idmapped_clone (o->lower, false, 0, &refs->lower, err) < 0)
        return -1;
    }
  else if ((refs->lower = open_tree (AT_FDCWD, o->lower, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)) < 0)
    return err_make_sys (err, errno, "clone the image at `%s`", o->lower);
  for (size_t i = 0; i < N_DEV_NODES; i++)
    {
      char src[64];
      snprintf (src, sizeof src, "/dev/%s", helper_dev_nodes[i]);
      refs->dev_nodes[i] = open_tree (AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
      if (refs->dev_nodes[i] < 0)
        return err_make_sys (err, errno, "clone `%s`", src);
    }
  refs->volumes = calloc (o->n_volumes + 1, sizeof *refs->volumes);
  if (refs->volumes == NULL)
    return err_make (err, ENOMEM, "out of memory");
  for (size_t i = 0; i < o->n_volumes; i++)
    refs->volumes[i] = -1;
  return capture_volumes (o, refs, err);
}

/* Makes the overlay at `root` the root of this mount namespace: moved over
 * the base's empty root and entered by chroot. No pivot_root per sandbox:
 * it walks every thread on the host (to move any that sits in the old
 * root), so a launch would cost more with every live sandbox. What lies
 * beneath is only the base's empty read-only tmpfs (the layers' mount
 * points were detached before): `..` at the root crosses back into the
 * overlay mounted there, and a setns into this namespace lands on it too. */
static int
enter_root (const char *root, err_t *err)
{
  if (chdir (root) < 0)
    return err_make_sys (err, errno, "chdir `%s`", root);
  if (mount (".", "/", NULL, MS_MOVE, NULL) < 0)
    return err_make_sys (err, errno, "move the sandbox's root over the base's");
  if (chroot (".") < 0)
    return err_make_sys (err, errno, "chroot into the sandbox's root");
  if (chdir ("/") < 0)
    return err_make_sys (err, errno, "chdir /");
  return 0;
}

/* The overlay of an image's layers: each attached at layers/N of the disk
 * (its root, beside upper and work, never seen inside), gone from there
 * with the disk's mount point once the overlay holds them. */
static int
mount_layers (const host_refs_t *refs, err_t *err)
{
  if (chdir (BASE_DISK) < 0)
    return err_make_sys (err, errno, "enter the disk");
  if (mkdir ("layers", 0700) < 0)
    return err_make_sys (err, errno, "mkdir `layers` on the disk");
  char opts[4096] = "lowerdir=";
  size_t len = strlen (opts);
  for (size_t i = 0; i < refs->n_layers; i++)
    {
      char name[32];
      snprintf (name, sizeof name, "layers/%zu", i);
      if (mkdir (name, 0700) < 0 || move_mount (refs->layers[i], "", AT_FDCWD, name, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        return err_make_sys (err, errno, "attach the image's layer %zu", i);
      len += (size_t) snprintf (opts + len, sizeof opts - len, "%s%s", i > 0 ? ":" : "", name);
    }
  len += (size_t) snprintf (opts + len, sizeof opts - len,
                            ",upperdir=upper,workdir=work,userxattr,redirect_dir=nofollow,metacopy=off,index=off");
  if (len >= sizeof opts)
    return err_make (err, E2BIG, "the image's overlay options are too long");
  if (mount ("overlay", BASE_ROOT, "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
    return err_make_sys (err, errno, "mount the overlay of the image's %zu layers", refs->n_layers);
  return 0;
}

/* Mounts the overlay of the image under the sandbox's upper layer at
 * BASE_ROOT, with the disk and the image attached at BASE_DISK and
 * BASE_LOWER of the base's copy. */
static int
mount_overlay (const helper_opts_t *o, const host_refs_t *refs, err_t *err)
{
  if (move_mount (helper_disk_fd, "", AT_FDCWD, BASE_DISK, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return err_make_sys (err, errno, "attach the disk");
  if (refs->n_layers > 0)
    return mount_layers (refs, err);
  if (move_mount (refs->lower, "", AT_FDCWD, BASE_LOWER, MOVE_MOUNT_F_EMPTY_PATH) < 0)
    return err_make_sys (err, errno, "attach the image");
  /* Upper and work are named relative to the disk. Device files of the
   * image are dead inside (nodev). Options pinned, whatever the kernel's
   * defaults: a renamed image directory, a chmod-ed or chown-ed image file
   * is real data in the upper layer, never an overlay redirect or
   * metadata-only copy that a snapshot (which carries no trusted.overlay.*
   * xattrs) would lose. */
  const char *opts = o->uid_range > 0 ? HELPER_USERNS_OVERLAY_OPTS (BASE_LOWER) : HELPER_OVERLAY_OPTS (BASE_LOWER);
  if (chdir (BASE_DISK) < 0)
    return err_make_sys (err, errno, "enter the disk");
  if (mount ("overlay", BASE_ROOT, "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
    return err_make_sys (err, errno, "mount the overlay (image `%s`)", o->lower);
  return 0;
}

/* The overlay keeps its own references to its layers: their mount points
 * go, so that nothing of the disk but the overlay (and /dev, /dev/shm,
 * bound later) is left in the sandbox's mount namespace. */
static int
detach_layers (const host_refs_t *refs, err_t *err)
{
  /* The image's layers are mounted below the disk's mount point: they go
   * with it. */
  if ((refs->n_layers == 0 && umount2 (BASE_LOWER, MNT_DETACH) < 0) || umount2 (BASE_DISK, MNT_DETACH) < 0)
    return err_make_sys (err, errno, "detach the layers' mount points");
  return 0;
}

/* The sandbox's root, from the inside: every path below is resolved in the
 * sandbox's own view after enter_root, so a symlink it planted in its
 * layer (/etc -> /etc, /dev -> /host/path) can only point into itself —
 * nothing here creates or writes a file on the host. */
static int
populate_root (const helper_opts_t *o, const host_refs_t *refs, err_t *err)
{
  return rootfs_setup_dev ("", refs, err) < 0 || rootfs_setup_proc (o, "", refs, err) < 0
                 || rootfs_mask_paths (o, "", refs, err) < 0 || attach_volumes (o, refs, err) < 0
             ? -1
             : 0;
}

/* Last, as the sandbox's root (inside its user namespace when it has one,
 * so what is made here is owned by root inside): the files a sandbox
 * expects. */
static void
populate_files (const helper_opts_t *o)
{
  if (o->egress)
    write_resolv_conf ();
  err_t ignored = ERR_INIT;
  helper_mkdir_p ("/root", 0700, &ignored);
  err_release (&ignored);
  helper_mkdir_p ("/tmp", 01777, &ignored);
  err_release (&ignored);
}

int
helper_holder_setup (const helper_opts_t *o, const sbx_cg_layout_t *cg, err_t *err)
{
  /* pid 1 sits in the sandbox's own group, which roots the sandbox's
   * cgroup namespace: its commands can move to their exec-N groups below. */
  if (sbx_cg_join (cg, o->id, NULL, err) < 0)
    return -1;
  /* The host's tree is captured first: what follows happens in a copy of
   * the base mount namespace, whose only mount is an empty read-only
   * tmpfs. */
  host_refs_t refs = {0};
  if (capture_host (o, &refs, err) < 0)
    return -1; /* the holder exits: its descriptors go with it */
  if (setns (SBX_BASE_NS_FD, CLONE_NEWNS) < 0)
    return err_make_sys (err, errno, "enter the base mount namespace");
  close (SBX_BASE_NS_FD);
  if (unshare (CLONE_NEWCGROUP | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) < 0)
    return err_make_sys (err, errno, "unshare namespaces");
  if (mount (NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    return err_make_sys (err, errno, "make mounts private");
  if (mount_overlay (o, &refs, err) < 0 || capture_own (&refs, err) < 0 || detach_layers (&refs, err) < 0)
    return -1;
  /* The overlay holds the image now: this process's own reference to the
   * host's tree goes before anything is resolved in the sandbox's view. */
  if (refs.lower > 0)
    close (refs.lower);
  refs.lower = -1;
  if (enter_root (BASE_ROOT, err) < 0 || populate_root (o, &refs, err) < 0)
    return -1;
  host_refs_release (&refs, o->n_volumes);
  const char *hn = o->hostname != NULL ? o->hostname : "sandbox";
  if (sethostname (hn, strlen (hn)) < 0)
    return err_make_sys (err, errno, "sethostname");
  if (helper_loopback_up (err) < 0 || (o->egress && helper_block_egress_routes (o, err) < 0))
    return -1;
  /* Everything that needs the host's root is done: from here on pid 1 is
   * the sandbox's root, an unprivileged host uid (what it starts inherits
   * that). */
  if (o->uid_range > 0 && helper_userns_enter (err) < 0)
    return -1;
  populate_files (o);
  return 0;
}

/* The base mount namespace, made once when the gateway starts: its only
 * mount is an empty read-only tmpfs with the mount points BASE_DISK,
 * BASE_LOWER and BASE_ROOT. pivot_root happens here, once, instead of in
 * every sandbox (its cost grows with the threads on the host). The
 * gateway keeps the namespace by the descriptor this reports, and hands it
 * to every launch as fd SBX_BASE_NS_FD; it ends with the gateway, mounts
 * and all. `at` is a directory of the gateway's, where the tmpfs is
 * attached (in this process's private namespace only) to pivot into. */
int
helper_base (const char *at)
{
  err_t err = ERR_INIT;
  cleanup_close int ns = -1, fs = -1, mnt = -1;
  struct mount_attr ro = {.attr_set = MOUNT_ATTR_RDONLY};
  static const char *const points[] = {BASE_DISK + 1, BASE_LOWER + 1, BASE_ROOT + 1};
  if (unshare (CLONE_NEWNS) < 0 || mount (NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
    err_make_sys (&err, errno, "a private mount namespace");
  else if ((ns = open ("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC)) < 0)
    err_make_sys (&err, errno, "open /proc/self/ns/mnt");
  else if ((fs = fsopen ("tmpfs", FSOPEN_CLOEXEC)) < 0
           || fsconfig (fs, FSCONFIG_SET_STRING, "source", "sandbox-base", 0) < 0
           || fsconfig (fs, FSCONFIG_SET_STRING, "size", "4k", 0) < 0
           || fsconfig (fs, FSCONFIG_SET_STRING, "nr_inodes", "8", 0) < 0
           || fsconfig (fs, FSCONFIG_SET_STRING, "mode", "0755", 0) < 0
           || fsconfig (fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0
           || (mnt = fsmount (fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)) < 0)
    err_make_sys (&err, errno, "make the base tmpfs");
  for (size_t i = 0; err.status == 0 && i < sizeof points / sizeof points[0]; i++)
    if (mkdirat (mnt, points[i], 0700) < 0)
      err_make_sys (&err, errno, "make the base's /%s", points[i]);
  if (err.status == 0
      && (mount_setattr (mnt, "", AT_EMPTY_PATH, &ro, sizeof ro) < 0
          || move_mount (mnt, "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) < 0 || chdir (at) < 0
          || syscall (SYS_pivot_root, ".", ".") < 0 || umount2 (".", MNT_DETACH) < 0 || chdir ("/") < 0))
    err_make_sys (&err, errno, "make the base tmpfs the root");
  return helper_answer (&err, ns);
}
