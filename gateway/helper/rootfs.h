/* helper/rootfs.h: what rootfs.c and kernfs.c share while a sandbox's
 * root is made: the host trees captured for it, and the kernel file systems
 * (/dev, /proc, masked paths) made in it. Internal to the helper. */
#ifndef GATEWAY_HELPER_ROOTFS_H
#define GATEWAY_HELPER_ROOTFS_H

#include "common/err.h"
#include "gateway/helper/helper.h"

/* Device nodes bound from the host into every sandbox's /dev (kernfs.c). */
#define N_DEV_NODES 6
extern const char *const helper_dev_nodes[N_DEV_NODES];

/* What the sandbox's root takes from the host, as detached mounts (open_tree
 * clones) captured before entering the base's copy, where the host's tree
 * is not. */
typedef struct host_refs_s
{
  int lower; /* the image (idmapped with a user namespace) */
  /* An image's layers instead (top first), idmapped from their owner
   * range (helper/layer.c) to the sandbox's ids. */
  int layers[HELPER_MAX_LAYERS];
  size_t n_layers;
  int dev_nodes[N_DEV_NODES];
  int *volumes; /* per volume; -1: its host path is gone */
  /* Directories of the sandbox's disk bound at /dev and /dev/shm, and an
   * empty one whose read-only clones cover masked directories: every
   * superblock a sandbox adds costs each memory cgroup on the machine a
   * share of the kernel's shrinker bookkeeping, so a sandbox makes only
   * the ones it cannot do without (disk, overlay, proc, devpts; its IPC
   * namespace adds an mqueue one). */
  int dev_dir, shm_dir, empty;
} host_refs_t;

/* kernfs.c, each under `root` ("" once inside it): /dev (the disk's dev/ and
 * shm/, the host's nodes, a new devpts), /proc (read-only knobs, masked
 * files) and the options' masked paths, covered read-only. */
int rootfs_setup_dev (const char *root, const host_refs_t *refs, err_t *err);
int rootfs_setup_proc (const helper_opts_t *o, const char *root, const host_refs_t *refs, err_t *err);
int rootfs_mask_paths (const helper_opts_t *o, const char *root, const host_refs_t *refs, err_t *err);

#endif
