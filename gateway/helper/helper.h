/* helper: what the files of sandbox-helper share — its options, the report
 * channel to the gateway, and the steps of a launch (see main.c for the
 * program as a whole).
 *
 *   main.c    the subcommands, reports
 *   options.c the command line, volume specs, id maps (pure)
 *   launch.c  cgroups, disk, restore, forking the holder, READY
 *   rootfs.c  the holder's namespaces and root (overlay, volumes)
 *   kernfs.c  /dev, /proc and masked paths in that root (rootfs.h)
 *   volumes.c a volume's spec and its detached, idmapped copy
 *   netns.c   loopback and egress routes
 *   holder.c  the sandbox's pid 1: commands and orphans
 *   userns.c  the sandbox's user namespace, idmapped mounts, the start-up probe
 *
 * Single-threaded throughout.
 */
#ifndef SBX_GATEWAY_HELPER_H
#define SBX_GATEWAY_HELPER_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/err.h"
#include "gateway/helper/confine.h"
#include "gateway/runtime/cgroup.h"
#include "gateway/runtime/wire.h"

typedef struct helper_opts_s
{
  const char *id;
  const char *state; /* the sandbox's state directory */
  const char *lower; /* the image root */
  const char *cgroup_mount;
  const char *cgroup_group;
  const char *hostname;
  const char *memcg_spare; /* a spare memory group to take, or NULL (runtime/cgroup.h) */
  long disk_mb;
  long disk_inodes;
  sbx_cg_limits_t limits;
  /* A group in the v1 cpu hierarchy even without a CPU limit (unlimited
   * until the gateway sets one: a pooled sandbox's, for its claim). */
  bool cpu_group;
  bool egress;          /* the sandbox gets user-mode networking */
  bool restore;         /* first unpack the tar on stdin into the layer */
  long max_entries;     /* restore: most tar entries accepted */
  long max_mb;          /* unpack-layer: most MiB of file data (0: none) */
  const char *unpacker; /* restore: path of sandbox-unpack */
  /* Lists from the command line, each sized for every argument (no cap). */
  const char **volumes; /* "host:sandbox[:ro]" */
  size_t n_volumes;
  const char **masks; /* host paths hidden inside */
  size_t n_masks;
  const char **blocked; /* host IPv4 addresses unreachable with egress */
  size_t n_blocked;
  /* The sandbox's own user namespace: its ids 0..uid_range-1 are host ids
   * uid_base.. (uids and gids alike). uid_range 0: none (SANDBOX_USERNS off). */
  unsigned long uid_base, uid_range;
  /* An image's layers instead of `lower`: directories, top first,
   * separated by ':' (at most HELPER_MAX_LAYERS), their files owned by
   * host ids layer_uid..layer_uid+65535 (layer.c). */
  const char *layers;
  unsigned long layer_uid;
} helper_opts_t;

/* options.c: the defaults of what the command line leaves out. */
#define HELPER_DEFAULT_DISK_MB 2048
#define HELPER_DEFAULT_INODES_PER_MB SBX_DISK_INODES_PER_MB /* --disk-inodes: this many per MiB of --disk-mb */
#define HELPER_DEFAULT_MAX_ENTRIES 1000000
/* Fills *o from the options after the subcommand (argv[2] on); o->volumes,
 * masks and blocked must have room for argc entries each. Defaults for
 * what is not given. -1 for an unknown option (getopt has said which on
 * stderr); --id and the rest are checked by the caller. */
int helper_opts_parse (int argc, char **argv, helper_opts_t *o);
/* One line of a uid_map or gid_map: "inside outside count\n" into buf;
 * its length, or -1 when it does not fit `cap` bytes. */
int helper_id_map_line (char *buf, size_t cap, long inside, unsigned long outside, unsigned long count);
/* volumes.c: a user namespace whose only ids are `count` from uid/gid,
 * standing for host ids root_id..: idmapping a mount through it shows
 * uid/gid's files as the sandbox's root's (a volume's owner, an image
 * layer's range). Every other id is unmapped. Its descriptor into *out. */
int helper_owner_userns (long uid, long gid, unsigned long root_id, unsigned long count, int *out, err_t *err);
/* Host ids of an image layer's owner range, and most layers of an image. */
#define HELPER_LAYER_IDS 65536
#define HELPER_MAX_LAYERS 128

/* The report socket to the gateway (fd 3). */
extern int helper_report_fd;
/* The memory of this program's arguments, scrubbed in the sandbox's pid 1:
 * its command line is readable inside and names host paths and the id. */
extern char *helper_args_start;
extern size_t helper_args_len;

/* main.c: an ERROR report of *err on `fd` (the other reports: wire.h's
 * writers). */
void helper_report_err (int fd, const err_t *err);
/* Ends a helper that makes one thing for the gateway (base, filter): ERROR
 * with *err (then released) when it is set, else READY with descriptor
 * `fd`. Exit status. */
int helper_answer (err_t *err, int fd);

/* launch.c: makes the sandbox and reports READY or ERROR. Exit status. */
int helper_launch (const helper_opts_t *o);
/* The sandbox's disk, a detached tmpfs mount (fsmount); -1 until made. */
extern int helper_disk_fd;

/* rootfs.c (and volumes.c: helper_parse_volume, helper_volume_clone) */
int helper_mkdir_p (const char *path, mode_t mode, err_t *err);
/* A volume, as the gateway checked it: "host:sandbox[:ro][:uid=N:gid=M]". */
typedef struct helper_volume_s
{
  char spec[PATH_MAX * 2];
  char *host, *dst; /* into spec */
  bool ro;
  /* The host ids sandbox root's writes land as (an idmapped mount): -1,
   * none — the sandbox's own ids, as they are on the host. */
  long uid, gid;
} helper_volume_t;
/* options.c: splits `in` (copied into v->spec, cut at its size); no
 * destination: v->dst is "". Unknown options are ignored. */
void helper_parse_volume (const char *in, helper_volume_t *v);
/* A detached copy of volume `v`'s tree, cloned from `fd` (the gateway's
 * descriptor of its host path): nosuid, nodev, read-only all the way down
 * for `:ro`, and with an owner, idmapped so that sandbox root (host id
 * `root_id`) is that owner. Into *out. */
int helper_volume_clone (const helper_volume_t *v, int fd, unsigned long root_id, int *out, err_t *err);
/* The overlay of a sandbox with a user namespace, from its disk (upper and
 * work there) over the idmapped image at `lower`. `userxattr`: overlay's
 * marks are user.overlay.* xattrs, which root inside a user namespace can
 * make (restore) and overlay hides from the sandbox; it also means no
 * redirects and no metacopy, so renamed and chmod-ed image files are real
 * data in the upper layer, as a snapshot needs. */
/* The same without a user namespace: overlay's marks are trusted.overlay.*
 * xattrs, and redirects are off outright. */
#define HELPER_OVERLAY_OPTS(lower)                                                                                   \
  "lowerdir=" lower ",upperdir=upper,workdir=work,redirect_dir=off,metacopy=off,index=off"
#define HELPER_USERNS_OVERLAY_OPTS(lower)                                                                            \
  "lowerdir=" lower ",upperdir=upper,workdir=work,userxattr,redirect_dir=nofollow,metacopy=off,index=off"
/* `sandbox-helper base --state DIR`: makes the base mount namespace every
 * sandbox's starts as a copy of, and reports READY with a descriptor of
 * it. Exit status. */
int helper_base (const char *at);
/* `sandbox-helper filter`: compiles the sandboxes' seccomp filter once
 * (sbx_confine_export; `--deny-setid`: with its set-id rule) and reports
 * READY with the sealed memory file that
 * holds it. Exit status. */
int helper_filter (bool deny_setid);
/* Runs as pid 1 of the new pid namespace, still in the helper's mount
 * namespace until it unshares its own; ends in the sandbox's root. */
int helper_holder_setup (const helper_opts_t *o, const sbx_cg_layout_t *cg, err_t *err);

/* netns.c */
int helper_loopback_up (err_t *err);
int helper_block_egress_routes (const helper_opts_t *o, err_t *err);

/* userns.c. The sandbox's user namespace, made once per launch (-1 until
 * then, and without one). */
extern int helper_userns_fd;
/* Makes it: ids 0..uid_range-1 map onto uid_base.. In three steps so the
 * launch can do other work meanwhile: start (a child makes it), finish (its
 * maps; helper_userns_fd is then set), reap (the child, once gone). */
int helper_userns_start (const helper_opts_t *o, err_t *err);
int helper_userns_finish (const helper_opts_t *o, err_t *err);
void helper_userns_reap (void);
/* All three at once. */
int helper_userns_make (const helper_opts_t *o, err_t *err);
/* Moves the calling (single-threaded) process into it as its root: uid and
 * gid 0 inside, no supplementary groups; the host sees uid_base. */
int helper_userns_enter (err_t *err);
/* A detached copy of the mount at `path` (recursive or not) showing its
 * files' owners through the sandbox's user namespace: host uid 0 appears as
 * uid_base, so as root inside. `attr_set` adds MOUNT_ATTR_* flags. */
int helper_idmapped_clone (const char *path, bool recursive, unsigned long attr_set, int *out, err_t *err);
/* `sandbox-helper probe`: can sandboxes have user namespaces here? READY
 * or ERROR with why. Exit status. */
int helper_probe (const helper_opts_t *o);
/* `sandbox-helper unpack-layer --id layer --state DIR --layer-uid N
 * --unpacker PATH --max-entries N`: the blob on stdin into the empty
 * directory DIR, unprivileged (layer.c). Reports READY or ERROR. Exit
 * status. */
int helper_unpack_layer (const helper_opts_t *o);

/* holder.c: serves the gateway's requests, a connection each on the
 * listening socket `ctl`, until the sandbox is deleted or `lifeline` (a
 * pidfd of the gateway) says the gateway has gone. `memcg` (or -1): the
 * `tasks` file of the sandbox's memory group, where every process the
 * holder starts goes (the holder itself is not in it: launch.c). */
void helper_holder_loop (int ctl, int lifeline, int memcg, const sbx_confine_t *confine) __attribute__ ((noreturn));

#endif
