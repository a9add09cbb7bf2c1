/* runtime/internal: what the runtime's files share and nothing outside
 * runtime/ sees — the sandbox record, the runtime's state, and the steps
 * each file offers the others.
 *
 *   registry.c  ids, the registry, acquire/release, get/delete
 *   registry_info.c  a record's info and usage, List
 *   layer_users.c    a sandbox's layer lent to readers, frozen or not
 *   runtime.c   new/stop/destroy
 *   launch.c    launch and restore (through sandbox-helper)
 *   pool.c      the warm pool; pool_shape.c a claim's resources
 *   exec.c      running a command through the sandbox's pid 1
 *   files.c     the file API, through a child of the sandbox's pid 1
 *   net.c       egress: the host's addresses, slirp4netns
 *   userns.c    the uid pool; uidblock.c its host-wide claim
 *   spawn.c     starting our programs, reading their reports, reaping
 *   reaper.c    what a previous run left behind, the idle reaper
 *
 * Threading: `mu` guards the registry list, every sandbox's bookkeeping
 * fields (ready, deleting, refs, helper, last_used_ms, exec_seq) and
 * `stopping`; it is never held across I/O or a wait but its own condition
 * waits on `cv`: what Get and List report of a process count or a disk is
 * read after it, from referenced records (sbx_info_measure); logs are
 * written after it. Held across a syscall only where the lock is what
 * makes it right, and none of them blocks: kill, waitid(WNOHANG) and
 * pidfd_open on a holder the lock keeps unreaped (the reaper and a
 * delete take the pid under it), and a layer user's cancel, which marks a
 * call cancelled. `cv` signals changes to them.
 */
#ifndef SBX_GATEWAY_RUNTIME_INTERNAL_H
#define SBX_GATEWAY_RUNTIME_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "gateway/runtime/cgroup.h"
#include "gateway/runtime/exec_env.h"
#include "gateway/runtime/runtime.h"
#include "gateway/runtime/wire.h"

/* Buffers a reader lends to sinks (sbx_exec_hold, sbx_exec_release): a few
 * per reader, each reused once no sink holds it. */
#define SBX_OUTBUFS 4
/* Most sandboxes the warm pool keeps (SANDBOX_WARM_POOL's cap; pool.c). */
#define SBX_POOL_MAX 64
/* Spare memory groups kept made ahead of launches (launch.c). */
#define SBX_SPARES 16
/* An output buffer, lent to a sink (sbx_exec_hold): its reader holds one
 * reference to each of its own, a sink one per message in flight
 * (exec_buffers.c). */
typedef struct sbx_outbuf_s
{
  atomic_int refs;
  size_t cap;     /* bytes in data */
  size_t charged; /* of those, counted against exec_buffer_total_bytes (given back when freed) */
  uint8_t data[];
} sbx_outbuf_t;
/* A new buffer of `size` bytes, `charge` of them counted against `limit`
 * in the gateway's total: NULL when they would pass it, or out of
 * memory. */
sbx_outbuf_t *sbx_outbuf_new (size_t size, size_t charge, size_t limit);
typedef struct sbx_outbufs_s
{
  sbx_outbuf_t *b[SBX_OUTBUFS];
} sbx_outbufs_t;
/* One of `size` bytes that no sink holds (a new one in place of one still
 * held when all are): NULL when out of memory. All of one set must be of
 * the same size. */
uint8_t *sbx_outbufs_get (sbx_outbufs_t *p, size_t size);
void sbx_outbufs_free (sbx_outbufs_t *p);

/* An exec's first output buffer, its own whatever other execs hold: its
 * reads are never smaller. While its client keeps up, later buffers double
 * up to SBX_EXEC_CHUNK, charged to the gateway's total. */
#define SBX_EXEC_BUF_FIRST (16 * 1024)
/* The buffers one exec reads its output into (exec_buffers.c): `first`, or
 * while the client keeps up one of `grown` (`want` bytes each, charged
 * against `total`, the gateway's exec_buffer_total_bytes). */
typedef struct sbx_exec_bufs_s
{
  sbx_outbuf_t *first;
  sbx_outbuf_t *grown[SBX_OUTBUFS];
  size_t want; /* starts at SBX_EXEC_BUF_FIRST; the reader doubles it */
  size_t total;
} sbx_exec_bufs_t;
/* A buffer no sink holds, to read output into: one of `want` bytes when
 * one is free or the total has room for a new one, else the first (reads
 * go on, smaller); NULL when none is free. */
sbx_outbuf_t *sbx_exec_bufs_get (sbx_exec_bufs_t *b);
/* Gives back the grown buffers no sink holds and starts small again. */
void sbx_exec_bufs_trim (sbx_exec_bufs_t *b);
/* Releases every buffer (a sink may still hold some: they go with it). */
void sbx_exec_bufs_free (sbx_exec_bufs_t *b);

/* A user of a sandbox's layer (sbx_with_layer), while it runs. */
typedef struct sbx_layer_user_s
{
  sbx_cancel_fn cancel;
  void *ctx;
  int64_t freeze_deadline_ms; /* monotonic; 0: not frozen */
  bool cancelled;
  struct sbx_layer_user_s *next;
} sbx_layer_user_t;

typedef struct sbx_s
{
  char id[SBX_ID_MAX + 1];
  char state[PATH_MAX + SBX_ID_MAX + 2];
  pid_t holder;            /* its pid 1, the gateway's child (adopted: it is their subreaper) */
  int64_t created_ms;      /* wall clock, as clients see it */
  int64_t created_mono_ms; /* monotonic: every duration is measured on it */
  int64_t last_used_ms;    /* monotonic */
  bool allow_egress;
  bool ready;    /* launch finished */
  bool deleting; /* removed from lookups */
  bool orphaned; /* unlinked by a delete while still referenced: the last release frees it */
  bool dead;     /* its holder died (reaper.c; holder then 0) */
  char dead_reason[128];
  int refs;          /* execs and layer users holding it */
  pid_t helper;      /* the launch helper, while launching */
  int disk_fd;       /* its disk, a mount attached only in its own mount namespace; the
                      * one descriptor the gateway holds per sandbox (exec requests
                      * connect to <state>/ctl each time), with port_spare */
  pid_t slirp;       /* slirp4netns, when egress is on */
  int slirp_exit_fd; /* closing it tells slirp4netns to exit */
  unsigned exec_seq;
  sbx_cg_events_t cg_seen;                     /* its limit events as the last exec saw them (rt->mu) */
  long uid_slot;                               /* its range in the uid pool; -1: none (SANDBOX_USERNS off) */
  sbx_layer_user_t *layer_users;               /* under rt->mu */
  pthread_mutex_t freeze_mu;                   /* orders freezes and thaws (held across their I/O) */
  int freezers;                                /* under freeze_mu: users holding the freeze */
  int bg_refs;                                 /* of refs: detached processes (do not keep it from idling) */
  int watches;                                 /* Watch calls running (rt->mu) */
  char store_gen[48];                          /* the stored snapshot version it came from or last wrote (rt->mu) */
  char image[SBX_IMAGE_REF_MAX + 1];           /* its image, "" for SANDBOX_ROOTFS */
  char image_digest[SBX_IMAGE_DIGEST_MAX + 1]; /* the image's manifest digest */
  const char *layers;                          /* while launching: the image's layers (borrowed) */
  int port_spare;                              /* an unconnected TCP socket made in its network namespace for
                                                * the next Forward, once there has been one (ports.c; rt->mu);
                                                * -1: none */
  bool port_spare_making;                      /* ports.c is making it (rt->mu) */
  /* Its process count and disk use as a List last read them, and when
   * (monotonic; 0: never) — rt->mu. */
  int64_t usage_ms;
  long usage_processes;
  uint64_t usage_disk_used, usage_disk_limit;
  /* Set by its launch before it is ready, then never changed: its limits
   * (effective), its launch environment and labels (sbx_strv_dup copies,
   * NULL: none). */
  sbx_resources_t res;
  char **env;
  char **labels;
  /* Its lifetime (rt->mu; Extend changes it): idle TTL, end of life
   * (monotonic ms, 0: none), whether to persist before an expiry; and
   * `expiring`: the idler is ending it. */
  sbx_lifetime_t life;
  int64_t end_of_life_ms;
  bool expiring;
  struct sbx_s *next;
  struct sbx_s **pprev; /* what points at this one in the list */
  struct sbx_s *hnext;  /* next in its bucket of the id index */
} sbx_t;

struct sbx_runtime_s
{
  sbx_config_t cfg;
  /* The host's own IPv4 addresses (loopback aside), unreachable from egress
   * sandboxes: slirp4netns connects from the host's network namespace.
   * NULL-terminated, owned. */
  char **host_addrs;
  sbx_cg_layout_t cg;
  char sandboxes_dir[PATH_MAX];
  /* The base mount namespace (helper_base): every launch's helper gets it
   * as SBX_BASE_NS_FD. -1 until made. */
  int base_ns_fd;
  /* The sandboxes' seccomp filter, compiled once (helper_filter): every
   * launch's helper gets it as SBX_FILTER_FD. -1 until made. */
  int filter_fd;
  /* Each volume's host directory (or file), opened once at start with no
   * symlink on the way (O_PATH): launches clone these, never the path,
   * which a sandbox could have changed since (-1 past the last). */
  int volume_fds[SBX_MAX_VOLUMES];
  size_t n_volume_fds;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sbx_t *list;
  size_t count;
  /* The id index: lookups cost the same with 10 or 10 000 sandboxes. */
  sbx_t **index;
  size_t index_mask;
  /* Layer users (exports and the like) linked to any sandbox: the reaper
   * looks for frozen-too-long ones only when there are some. */
  size_t layer_users;
  bool stopping;
  pthread_t reaper;
  bool reaper_running;
  pthread_t idler; /* deletes idle sandboxes, apart from the reaper's ticks (reaper.c) */
  bool idler_running;
  /* What ends an expired sandbox that is to be persisted (lifetime.c). */
  sbx_expire_fn expire;
  void *expire_ctx;
  /* Told of every sandbox that ends (registry.c, reaper.c); set before
   * any sandbox exists, then only read. */
  sbx_end_fn ended;
  void *ended_ctx;
  /* Spare memory groups made ahead of launches (cgroup v1; launch.c),
   * under mu: their numbers, and the next number to make. */
  unsigned spares[SBX_SPARES];
  size_t n_spares;
  unsigned spare_seq;
  pthread_t spare_maker;
  bool spare_maker_running;
  /* The warm pool (pool.c), under mu: ready sandboxes in no list, those
   * being made, places given up for launches that have not reserved
   * theirs yet, the next placeholder number, launches that found it
   * empty. All but the last two count against SANDBOX_MAX
   * (sbx_pool_held_locked). */
  sbx_t *pool[SBX_POOL_MAX];
  size_t pool_n, pool_building, pool_yielded;
  unsigned pool_seq;
  unsigned long pool_fallbacks;
  int64_t pool_claim_ms; /* monotonic ms of the latest claim */
  pthread_t pool_filler;
  bool pool_filler_running;
  /* The uid pool (userns.c), under mu: the free ranges' slots in the order
   * they were freed (a ring of uid_slots, uid_nfree of them from
   * uid_head), so that a range rests as long as possible before it is
   * given again. */
  long *uid_free;
  size_t uid_slots, uid_head, uid_nfree;
  /* The host-wide claim on the pool's block (uidblock.c): a file under
   * SANDBOX_UID_LOCK_DIR, locked while this descriptor is open; -1: none. */
  int uid_claim_fd;
  char uid_claim_path[PATH_MAX];
  /* The egress filter (egress.c): connect4 and sendmsg4 programs, and on a
   * hybrid layout where slirp4netns' v2 groups live. */
  int egress_progs[2];
  bool egress_filtered;
  char egress_root[PATH_MAX];
  /* Detached processes (proc.c). */
  pthread_mutex_t proc_mu;
  pthread_cond_t proc_cv; /* CLOCK_MONOTONIC */
  struct sbx_proc_s *procs;
  int proc_threads; /* detached processes' threads still running */
};

/* registry.c: calls the end hook (sbx_set_end_hook), if any, for sandbox
 * `id` created at `created_ms`; rt->mu not held. */
void sbx_tell_ended (sbx_runtime_t *rt, const char *id, int64_t created_ms);

/* proc.c: drops every process record of sandbox `sid` (being deleted). */
void sbx_proc_forget_sandbox (sbx_runtime_t *rt, const char *sid);
/* proc.c: waits until every detached process's thread has ended (their
 * sandboxes are gone), before the runtime is freed. */
void sbx_proc_wait_threads (sbx_runtime_t *rt);

/* exec_control.c: a connection to the control socket of the pid 1 of the sandbox
 * whose state directory is `state` (ESRCH when it does not answer). */
int sbx_connect_holder (const char *state, const char *id, err_t *err);

/* spec.c: a copy of `v` (NULL-terminated strings) in one allocation, or
 * NULL when out of memory (or `v` is NULL or empty). */
char **sbx_strv_dup (char *const *v);
/* `base` ("NAME=value", NULL-terminated) less the names `env` has, then
 * `env`'s entries: a copy in one allocation, NULL when `base` is NULL (or
 * out of memory: *oom). */
char **sbx_env_under (char *const *base, char *const *env, bool *oom);
/* The smallest limits a sandbox starts under (its set-up runs in them; the
 * configuration's own minimums). */
#define SBX_MIN_MEMORY_MB 16
#define SBX_MIN_DISK_MB 16
#define SBX_MIN_PIDS 8

/* Clocks: wall time for what clients see, monotonic for every duration. */
int64_t sbx_wall_ms (void);
int64_t sbx_mono_ms (void);

/* registry.c. The *_locked functions need rt->mu held. */
int sbx_index_init (sbx_runtime_t *rt, err_t *err);
sbx_t *sbx_find_locked (sbx_runtime_t *rt, const char *id);
void sbx_link_locked (sbx_runtime_t *rt, sbx_t *s);
void sbx_unlink_locked (sbx_runtime_t *rt, sbx_t *s);
/* What a Get, a List or a launch answers, in two steps so that the
 * registry lock is never held across the reads: sbx_info_copy_locked
 * copies the bookkeeping fields (rt->mu held) and takes a reference;
 * sbx_info_measure (rt->mu not held) reads the process count and the disk
 * use and drops that reference. sbx_list reads the usage (sbx_info_read_usage)
 * only of sandboxes used since a List last read it or read more than
 * SBX_LIST_USAGE_MAX_AGE_MS ago, and drops its references under one lock. */
void sbx_info_copy_locked (sbx_t *s, sbx_info_t *out);
void sbx_info_measure (sbx_runtime_t *rt, sbx_t *s, sbx_info_t *out);
void sbx_info_read_usage (sbx_runtime_t *rt, sbx_t *s, sbx_info_t *out);
/* A ready sandbox, referenced (renews its idle timer), or NULL. */
sbx_t *sbx_acquire (sbx_runtime_t *rt, const char *id);
void sbx_release (sbx_runtime_t *rt, sbx_t *s);
/* Drops a reference (rt->mu held); true when it was the last one of an
 * orphaned record, which the caller then frees with sbx_free_record once
 * it has unlocked. sbx_release does both (and renews the idle timer). */
bool sbx_unref_locked (sbx_runtime_t *rt, sbx_t *s);
void sbx_free_record (sbx_t *s);
/* How long a delete waits for calls still using its sandbox after its
 * processes were killed (sbx_delete). */
#define SBX_DELETE_WAIT_MS 2000
/* Kills and releases everything of a sandbox no longer in lookups. Safe on
 * a half-made sandbox (`holder` 0: none yet). */
void sbx_teardown (sbx_runtime_t *rt, const char *id, const char *state, pid_t holder);

/* spawn.c */
void sbx_spawn_attr_init (posix_spawnattr_t *attr);
/* Descriptors the gateway keeps for a sandbox's life (its disk; with
 * egress, slirp4netns' exit pipe) sit at or above SBX_FD_HIGH, the
 * short-lived ones of calls and launches below it (the gateway keeps
 * GW_FDS_RESERVED of its open-file limit for those): a helper starts with
 * a copy of the table below it only (sbx_spawn_helper). */
#define SBX_FD_HIGH 2048
/* Most descriptors a helper starts with: stdio, report, base, filter, volumes. */
#define SBX_SPAWN_MAX_FDS (SBX_VOLUME_FD0 + SBX_MAX_VOLUMES)
/* The volumes' descriptors sit from here (below SBX_FD_HIGH): above every
 * number a helper's descriptors are given, so that posix_spawn's dup2s in
 * order (the fallback) never overwrite one before it is copied. */
#define SBX_VOLUME_FDS_AT 64
/* `fd` moved to SBX_FD_HIGH or above (close-on-exec); as it was when the
 * open-file limit leaves no room there. */
int sbx_fd_keep (int fd);
/* Spawns sandbox-helper with stdio on in/out/errfd and the report socket
 * as fd 3, the base mount namespace and the filter as 4 and 5 and, with
 * `volumes` (a launch, the probe), the held volumes from
 * SBX_VOLUME_FD0 on. *report_fd is the gateway's end. */
int sbx_spawn_helper (sbx_runtime_t *rt, char *const *argv, int in, int out, int errfd, bool volumes, pid_t *pid,
                      int *report_fd, err_t *err);
/* Runs a helper that answers with one report and exits (probe, base):
 * stdio on /dev/null, its report (and at most one descriptor, into *fd
 * when fd is not NULL) awaited for timeout_ms, then it is killed if
 * silent and reaped. *got as sbx_read_report's return. -1 with *err when
 * it could not be started. */
int sbx_run_helper_once (sbx_runtime_t *rt, const char *const *argv, bool volumes, int timeout_ms, sbx_report_t *r,
                         int *fd, int *got, err_t *err);
/* waitpid, retrying EINTR. */
void sbx_reap (pid_t pid);
/* Removes a tree on the host, not crossing mounts nor following links. */
void sbx_remove_tree (const char *path);

/* The environment of the programs the gateway starts (helper, unpacker,
 * slirp4netns): PATH only, never the gateway's own (secrets, credentials). */
extern char *const sbx_helper_env[];

/* net.c */
/* Lists the host's IPv4 addresses into rt->host_addrs. */
int sbx_net_scan_host (sbx_runtime_t *rt, err_t *err);
/* Starts slirp4netns for `s` (holder running) and waits until its network
 * is configured. */
int sbx_net_start (sbx_runtime_t *rt, sbx_t *s, err_t *err);
/* Stops slirp4netns (tolerates one never started). */
void sbx_net_stop (pid_t slirp, int exit_fd);

/* registry.c: tells every layer user of `s` to stop (rt->mu held). */
void sbx_cancel_layer_users_locked (sbx_t *s, int status, const char *why);
/* Cancels the layer users past their freeze deadline. */
void sbx_enforce_freeze_deadlines (sbx_runtime_t *rt);

/* userns.c: the pool of host uid ranges, one per live sandbox: exactly
 * SANDBOX_UID_SLOTS of them from SANDBOX_UID_BASE. */
int sbx_uid_pool_init (sbx_runtime_t *rt, err_t *err);
/* The free range freed longest ago (or never used), or -1: every range is
 * in use. */
long sbx_uid_take_locked (sbx_runtime_t *rt);
/* Gives `slot` back, behind every other free one; -1 is ignored. */
void sbx_uid_release_locked (sbx_runtime_t *rt, long slot);
uint32_t sbx_uid_base (const sbx_runtime_t *rt, long slot);

/* uidblock.c: the host-wide claim on the pool's block — refused (naming
 * SANDBOX_UID_BASE and SANDBOX_UID_SLOTS) when another running gateway's
 * claimed block overlaps it — and a warning when /etc/subuid or
 * /etc/subgid gives part of it to another user. Held until
 * sbx_uid_block_release. */
int sbx_uid_block_claim (sbx_runtime_t *rt, err_t *err);
void sbx_uid_block_release (sbx_runtime_t *rt);
/* Checks, once at start, that sandboxes can have user namespaces here: an
 * idmapped image and an overlay with `userxattr` over it. */
int sbx_userns_probe (sbx_runtime_t *rt, err_t *err);

/* egress.c: the egress filter outside the sandboxes (see there). */
int sbx_egress_init (sbx_runtime_t *rt, err_t *err);
/* Moves slirp4netns `pid` of sandbox `id` into its filtered group. */
int sbx_egress_confine (sbx_runtime_t *rt, const char *id, pid_t pid, err_t *err);
/* Removes that group (slirp4netns gone). */
void sbx_egress_release (sbx_runtime_t *rt, const char *id);

/* launch.c: keeps spare memory groups (runtime/cgroup.h) for launches to
 * take, between SBX_SPARES / 2 and SBX_SPARES of them, until the runtime
 * stops. */
void *sbx_spare_maker_main (void *arg);
/* Removes the cgroups of sandbox `id`, whose processes are gone; its memory
 * group becomes a spare when there is room for one. */
int sbx_remove_groups (sbx_runtime_t *rt, const char *id, err_t *err);

/* launch.c: runs sandbox-helper for record `s`, in no list (a pooled
 * sandbox, given a group in the cpu hierarchy whether or not it has a CPU
 * limit), until its pid 1 is ready; the caller tears down on failure. */
int sbx_launch_build (sbx_runtime_t *rt, sbx_t *s, err_t *err);
/* The limit events sandbox `id`'s groups count already (a spare memory
 * group keeps a deleted sandbox's): what its first exec compares with. */
void sbx_launch_counters (sbx_runtime_t *rt, const char *id, sbx_cg_events_t *out);

/* pool.c: the warm pool. The filler keeps cfg.warm_pool sandboxes made,
 * niced, until the runtime stops. */
void *sbx_pool_filler_main (void *arg);
/* A pooled sandbox renamed to `id` and linked (not ready) into *out: 1;
 * 0 when this launch is not served by the pool (an image, a restore,
 * egress, an empty pool, an id taken: the caller launches as usual); -1
 * with *err (EIO) when the claim failed. */
int sbx_pool_claim (sbx_runtime_t *rt, const char *id, bool allow_egress, const sbx_image_t *img, bool restore,
                    sbx_t **out, err_t *err);
/* pool_shape.c: gives claimed `s` (linked, not ready, made with s->res)
 * the resources `res`, changing its cgroup limits and disk size in place;
 * s->res = *res on success. -1 (EIO) when a change fails: the caller
 * destroys the sandbox. */
int sbx_pool_shape (sbx_runtime_t *rt, sbx_t *s, const sbx_resources_t *res, err_t *err);
/* Destroys one pooled sandbox when the pool's and the live ones fill
 * SANDBOX_MAX, keeping its place for the launch that asked: true when it
 * did (that launch's reserve then takes the place). */
bool sbx_pool_yield (sbx_runtime_t *rt);
/* The places the pool holds against SANDBOX_MAX (rt->mu held). */
size_t sbx_pool_held_locked (const sbx_runtime_t *rt);
/* Destroys every pooled sandbox (the filler has stopped). */
void sbx_pool_drain (sbx_runtime_t *rt);

/* lifetime.c: sets `s`'s lifetime from `life` (rt->mu held), its end of
 * life counted from now. */
void sbx_lifetime_set_locked (sbx_t *s, const sbx_lifetime_t *life);
/* The wall-clock time `s` expires (rt->mu held), 0: never. */
int64_t sbx_expires_at_locked (const sbx_t *s);
/* A sandbox that has expired, marked `expiring` (rt->mu held): its id and
 * why ("idle", "max_lifetime") and whether to persist it first; false when
 * none. Past its end of life a sandbox expires busy or not. */
bool sbx_find_expired_locked (sbx_runtime_t *rt, char id[SBX_ID_MAX + 1], const char **why, bool *persist);

/* reaper.c */
/* Kills, unmounts and removes what a previous run left behind. */
void sbx_clean_leftovers (sbx_runtime_t *rt);
void *sbx_reaper_main (void *arg);
void *sbx_idler_main (void *arg);

#endif
