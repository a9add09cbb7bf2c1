/* runtime: the gateway's side of the sandbox runtime.
 *
 * Owns the registry of live sandboxes and their lifecycle: launch (through
 * sandbox-helper), exec with streamed output, delete, get/list, the idle
 * TTL, and cleaning what a previous run left behind. Namespace, mount and
 * cgroup set-up happen in the helper; this module spawns it, reads its
 * reports, pumps pipes, and tears down (kill, unmount, remove).
 *
 * Threading: every function may be called from any thread. The registry is
 * guarded by one mutex held only for bookkeeping, never across I/O; a
 * sandbox in use by an exec is reference counted so a concurrent delete
 * waits for nothing but frees it last.
 */
#ifndef SBX_GATEWAY_RUNTIME_H
#define SBX_GATEWAY_RUNTIME_H

#include <stdbool.h>
#include <sys/uio.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "gateway/runtime/wire.h"

#define SBX_ID_MAX 64
#define SBX_EXEC_CHUNK (256 * 1024)
#define SBX_EXEC_DEFAULT_TIMEOUT 1800
#define SBX_EXEC_MAX_TIMEOUT 3600
/* Longest image reference, and a manifest digest ("sha256:" + 64 hex). */
#define SBX_IMAGE_REF_MAX 255
#define SBX_IMAGE_DIGEST_MAX 71

typedef struct sbx_config_s
{
  /* Told the result of the runtime's self-check every few seconds, from
   * its reaper thread: NULL when it passes, else what fails (may be NULL). */
  void (*health) (const char *failure);
  const char *state_dir;    /* SANDBOX_STATE_DIR */
  const char *rootfs;       /* SANDBOX_ROOTFS: the image, lower layer */
  const char *helper;       /* path of sandbox-helper */
  const char *unpacker;     /* path of sandbox-unpack */
  const char *cgroup_mount; /* normally /sys/fs/cgroup */
  const char *cgroup_group; /* this instance's cgroup, one path component */
  const char *slirp4netns;  /* program for egress networking */
  long disk_mb;
  long max_sandboxes;
  long pids_max;
  long memory_mb;
  long cpu_millis;            /* 0: unlimited */
  long idle_ttl_seconds;      /* 0: never */
  long freeze_max_seconds;    /* longest a layer user may keep a sandbox frozen */
  long snapshot_max_entries;  /* most entries a restored tar may have */
  long image_layer_max_mb;    /* most MiB of file data one image layer unpacks to */
  bool allow_egress;          /* ALLOW_EGRESS: the gateway permits egress */
  const char *const *volumes; /* "realhost:sandbox[:ro][:uid=N:gid=M]", NULL-terminated, checked */
  const char *const *masks;   /* host paths hidden inside sandboxes, NULL-terminated */
  bool userns;                /* SANDBOX_USERNS: each sandbox in its own user namespace */
  long uid_base;              /* SANDBOX_UID_BASE: the pool's first host uid */
  long uid_range;             /* SANDBOX_UID_RANGE: host uids per sandbox */
  long uid_slots;             /* SANDBOX_UID_SLOTS: ranges in the pool, >= max_sandboxes */
  const char *uid_lock_dir;   /* SANDBOX_UID_LOCK_DIR: where gateways claim their blocks */
  long max_processes;         /* SANDBOX_MAX_PROCESSES: detached processes running per sandbox */
  long process_retain;        /* SANDBOX_PROCESS_RETAIN: exited ones kept per sandbox */
  long process_buffer_bytes;  /* SANDBOX_PROCESS_BUFFER_BYTES: output kept per stream */
  bool idle_counts_processes; /* SANDBOX_IDLE_TTL_COUNTS_PROCESSES */
  long max_watches;           /* SANDBOX_MAX_WATCHES: Watch calls running per sandbox */
  /* SANDBOX_EXEC_BUFFER_TOTAL_MB, in bytes: the output buffers all execs
   * hold beyond each one's first (16 KiB); at it they read into that one. */
  long exec_buffer_total_bytes;
  long image_uid;          /* SANDBOX_IMAGE_UID: first host id of the image layers' owner range */
  long max_contexts;       /* SANDBOX_MAX_CONTEXTS: code contexts per sandbox */
  long max_contexts_total; /* SANDBOX_MAX_CONTEXTS_TOTAL: code contexts of all sandboxes */
  long warm_pool;          /* SANDBOX_WARM_POOL's `default`: pooled sandboxes of SANDBOX_ROOTFS kept ready */
  /* The most a launch may ask for (LaunchRequest.resources), each at
   * least the per-sandbox default above; max_cpu_millis 0: any. */
  long max_memory_mb;
  long max_cpu_millis;
  long max_disk_mb;
  long max_pids;
  /* The longest idle TTL and lifetime a launch or an Extend may ask for
   * (SANDBOX_MAX_IDLE_TTL, SANDBOX_MAX_LIFETIME), in seconds. */
  long max_idle_ttl_seconds;
  long max_lifetime_seconds;
  /* Whether an expiring sandbox is persisted first when its launch does not
   * say (the SIGTERM drain's choice: a store was configured). */
  bool persist_on_expiry;
} sbx_config_t;

typedef struct sbx_runtime_s sbx_runtime_t;

/* A sandbox's limits. In a launch's spec 0 is the gateway's default
 * (sbx_config_t); in sbx_info_t they are the effective ones, cpu_millis 0
 * meaning unlimited. */
typedef struct sbx_resources_s
{
  long memory_mb;
  long cpu_millis; /* 1000: one CPU */
  long disk_mb;
  long pids_max;
} sbx_resources_t;

/* The launch environment's caps (LaunchRequest.env): entries, a name's and
 * a value's bytes, and all entries' bytes together ("NAME=value"), which
 * leaves room for a command's own within SBX_EXEC_MAX. */
#define SBX_LAUNCH_ENV_MAX 128
#define SBX_LAUNCH_ENV_NAME_MAX 256
#define SBX_LAUNCH_ENV_VALUE_MAX (32 * 1024)
#define SBX_LAUNCH_ENV_TOTAL_MAX (64 * 1024)

/* What a launch asks for beyond its id and image. Strings are borrowed for
 * the call; the sandbox keeps copies. */
typedef struct sbx_spec_s
{
  bool allow_egress;
  sbx_resources_t resources; /* 0 fields: the defaults */
  /* "NAME=value", NULL-terminated, may be NULL: beneath every command's
   * own environment (sbx_exec_req_t.env wins). */
  char *const *env;
  /* "key=value" (common/labels.h syntax, checked by the caller),
   * NULL-terminated, may be NULL. */
  char *const *labels;
  /* Seconds; 0: the gateway's SANDBOX_IDLE_TTL, and no lifetime limit. */
  long idle_ttl_seconds;
  long max_lifetime_seconds;
  int persist_on_expiry; /* -1: the gateway's default (sbx_config_t) */
} sbx_spec_t;

/* A sandbox's lifetime: its idle TTL (0: never idles out) and most
 * lifetime (0: none) in seconds, and whether it is persisted to the store
 * before an expiry deletes it. */
typedef struct sbx_lifetime_s
{
  long idle_ttl_seconds;
  long max_lifetime_seconds;
  bool persist_on_expiry;
} sbx_lifetime_t;

/* Checks a launch's spec against the gateway's maxima and caps and fills
 * *effective (defaults for 0 fields). EINVAL naming the field and the
 * maximum (`resources.memory_mb 4096 is above the maximum of 2048
 * (SANDBOX_MAX_MEMORY_MB)`), or the env entry. */
int sbx_spec_check (const sbx_runtime_t *rt, const sbx_spec_t *spec, sbx_resources_t *effective, sbx_lifetime_t *life,
                    err_t *err);

/* Told to end sandbox `id`, which has expired (`why`: "idle" or
 * "max_lifetime") and is to be persisted first: it persists and then
 * deletes it (sbx_delete), on the idler's thread (expiries wait for it). */
typedef void (*sbx_expire_fn) (void *ctx, sbx_runtime_t *rt, const char *id, const char *why);
/* Sets the hook (before any sandbox exists); without one an expired
 * sandbox is deleted without persisting. */
void sbx_set_expire_hook (sbx_runtime_t *rt, sbx_expire_fn fn, void *ctx);

/* Told that sandbox `id` (created at `created_ms`, as sbx_info_t has it)
 * has ended: deleted for any reason (Delete, an expiry, a Connect that
 * replaces it, the shutdown) or dead (its pid 1 died). Its processes are
 * killed by then. Called on the thread that ended it (a caller of
 * sbx_delete, the idler, the reaper), with none of the runtime's locks
 * held; it must not wait for a sandbox. A dead sandbox is told again when
 * it is deleted. What other layers keep beside a sandbox (code contexts)
 * goes with it here; the runtime knows nothing of them. */
typedef void (*sbx_end_fn) (void *ctx, sbx_runtime_t *rt, const char *id, int64_t created_ms);
/* Sets the hook (before any sandbox exists); NULL: none. */
void sbx_set_end_hook (sbx_runtime_t *rt, sbx_end_fn fn, void *ctx);

typedef struct sbx_info_s
{
  char id[SBX_ID_MAX + 1];
  int64_t created_ms;
  int64_t last_used_ms;
  bool allow_egress;
  long process_count;
  uint64_t disk_used_bytes;
  uint64_t disk_limit_bytes;
  /* The version of its stored snapshot (store.h, snap_gen_t.gen) it was
   * restored from or last persisted, "" when neither: what tells a copy
   * that another gateway has written the snapshot since (session.c). */
  char store_gen[48];
  /* Its pid 1 died (the sandbox is dead: its processes were killed, and
   * it waits for a Delete, or a Connect that restores it), and why. */
  bool dead;
  char dead_reason[128];
  /* The image it runs on, as its launch named it, and the manifest digest
   * used; both "" on SANDBOX_ROOTFS. */
  char image[SBX_IMAGE_REF_MAX + 1];
  char image_digest[SBX_IMAGE_DIGEST_MAX + 1];
  sbx_resources_t resources; /* the effective limits */
  sbx_lifetime_t lifetime;   /* the effective lifetime */
  /* When it expires as things stand (wall clock, ms): the earlier of its
   * idle deadline and its end of life; 0: never. */
  int64_t expires_at_ms;
  /* Only from sbx_list_matching: a copy of its labels ("key=value",
   * NULL-terminated, one allocation the caller frees), NULL: none. */
  char **labels;
} sbx_info_t;

/* True when egress sandboxes are held to the egress policy by a filter
 * outside them (cgroup v2 + BPF), not only by routes in their namespaces. */
bool sbx_egress_filtered (const sbx_runtime_t *rt);

/* True when `id` matches ^[A-Za-z0-9][A-Za-z0-9_-]*$ and has at most 64
 * characters. */
bool sbx_id_valid (const char *id);
/* The one "no such sandbox" error: ENOENT, reason
 * ERR_REASON_SANDBOX_NOT_FOUND, the message "sandbox `<id>` not found" and
 * `more` (may be NULL) after it. Returns -1. */
int sbx_err_not_found (err_t *err, const char *id, const char *more);

/* Detects cgroups, removes what a previous run left (processes, mounts,
 * cgroups, state directories) and starts the idle reaper. `cfg` strings are
 * borrowed for the runtime's lifetime. */
int sbx_runtime_new (const sbx_config_t *cfg, sbx_runtime_t **out, err_t *err);

/* Starts shutting down: launches in flight are aborted (and clean up after
 * themselves) and new ones fail with ESHUTDOWN. */
void sbx_runtime_stop (sbx_runtime_t *rt);

/* Stops, deletes every sandbox and frees the runtime. */
void sbx_runtime_destroy (sbx_runtime_t *rt);

/* Creates an empty sandbox. EINVAL bad id, EEXIST live id, EAGAIN too many. */
int sbx_launch (sbx_runtime_t *rt, const char *id, bool allow_egress, sbx_info_t *out, err_t *err);

/* The image a sandbox runs on instead of SANDBOX_ROOTFS: its unpacked
 * layers (directories owned by the SANDBOX_IMAGE_UID range, see
 * gateway/image/), borrowed for the call. */
typedef struct sbx_image_s
{
  const char *ref;    /* as the launch named it */
  const char *digest; /* the manifest digest */
  const char *layers; /* layer directories, top first, ':'-separated */
} sbx_image_t;

/* Pulls the next piece of a tar stream: 1 with its bytes in `iov[0..*n)`
 * (at most *n spans; valid until the next call; *n is set to the number
 * used), 0 at the end, -1 with *err. A piece of several spans (a gRPC
 * message as it arrived, frame by frame) goes to the unpacker in one
 * writev. */
typedef int (*sbx_source_fn) (void *ctx, struct iovec *iov, int *n, err_t *err);

/* Creates a sandbox whose writable layer is unpacked from the tar stream
 * `src` (plain, gzip or zstd; OCI whiteouts become overlay whiteouts) before
 * the sandbox starts. The stream is unpacked as it arrives by a helper
 * chrooted in the new layer. EINVAL for a hostile or broken tar, ENOSPC
 * over the disk quota, and as sbx_launch. */
int sbx_restore (sbx_runtime_t *rt, const char *id, bool allow_egress, sbx_source_fn src, void *ctx, sbx_info_t *out,
                 err_t *err);

/* sbx_restore (src may be NULL: an empty layer, as sbx_launch) on image
 * `img` (NULL: SANDBOX_ROOTFS). */
int sbx_launch_on (sbx_runtime_t *rt, const char *id, bool allow_egress, const sbx_image_t *img, sbx_source_fn src,
                   void *ctx, sbx_info_t *out, err_t *err);

/* sbx_launch_on with a spec (NULL: as sbx_launch_on with no egress):
 * resources, launch environment and labels. EINVAL as sbx_spec_check. */
int sbx_launch_spec (sbx_runtime_t *rt, const char *id, const sbx_spec_t *spec, const sbx_image_t *img,
                     sbx_source_fn src, void *ctx, sbx_info_t *out, err_t *err);

/* A copy of sandbox `id`'s labels ("key=value", NULL-terminated, one
 * allocation: free it; NULL when it has none). ENOENT unknown. */
int sbx_labels_get (sbx_runtime_t *rt, const char *id, char ***out, err_t *err);

/* Its launch environment overlaid by `env` ("NAME=value", may be NULL):
 * the launch's entries `env` does not name, then `env`'s. *out is one
 * allocation (free it), NULL-terminated; *out NULL when the sandbox has no
 * launch environment (use `env` as it is). ENOENT unknown. */
int sbx_env_overlay (sbx_runtime_t *rt, const char *id, char *const *env, char ***out, err_t *err);

/* Unpacks the image layer blob on `blob_fd` (a tar, plain, gzip or zstd,
 * already verified against its digest) into the empty directory `dir`,
 * unprivileged (layer.c): files owned by the SANDBOX_IMAGE_UID range, OCI
 * whiteouts and opaque directories as an overlay mounted with `userxattr`
 * reads them, nothing outside `dir`. EINVAL a hostile or broken layer,
 * ETIMEDOUT past timeout_ms; the caller removes `dir` on failure. */
int sbx_unpack_layer (sbx_runtime_t *rt, int blob_fd, const char *dir, int timeout_ms, err_t *err);
/* Removes a layer directory (not crossing mounts nor following links). */
void sbx_layer_remove (const char *path);

/* A sandbox's writable layer, as sbx_with_layer hands it over. */
typedef struct sbx_layer_s
{
  int upper_fd; /* the overlay's upper directory (the sandbox's disk holds it) */
  /* With a user namespace: the sandbox's host uid/gid range (its root is
   * uid_base), and the overlay's marks are user.overlay.* (`userxattr`).
   * uid_range 0: no user namespace, ids are host ids. */
  uint32_t uid_base, uid_range;
  bool userxattr;
} sbx_layer_t;

/* Runs fn(the layer) while holding the sandbox, with its
 * processes frozen when `freeze` (thawed afterwards whatever happens).
 * Freezes are counted: concurrent users share one, and the sandbox thaws
 * when the last one ends. A user that keeps the sandbox frozen longer than
 * SANDBOX_EXPORT_FREEZE_SECONDS, or whose sandbox is deleted, is told to
 * stop through `cancel` (called from another thread; it must make `fn`
 * return soon, e.g. by cancelling the call `fn` streams to); `fn` then
 * fails and the sandbox thaws. */
typedef int (*sbx_layer_fn) (const sbx_layer_t *layer, void *ctx, err_t *err);
typedef void (*sbx_cancel_fn) (void *ctx, int status, const char *why);
int sbx_with_layer (sbx_runtime_t *rt, const char *id, bool freeze, sbx_layer_fn fn, void *ctx, sbx_cancel_fn cancel,
                    void *cancel_ctx, err_t *err);

/* Kills everything in the sandbox and releases all it holds. ENOENT unknown. */
int sbx_delete (sbx_runtime_t *rt, const char *id, err_t *err);

/* Describes a sandbox (and renews its idle timer). ENOENT unknown. */
int sbx_get (sbx_runtime_t *rt, const char *id, sbx_info_t *out, err_t *err);

/* Extend: sets sandbox `id`'s idle TTL (0: unchanged) and renews its idle
 * timer, and with max_lifetime_seconds > 0 ends its life that many seconds
 * from now instead. EINVAL above SANDBOX_MAX_IDLE_TTL /
 * SANDBOX_MAX_LIFETIME (nothing changed), ENOENT unknown. *out as sbx_get. */
int sbx_extend (sbx_runtime_t *rt, const char *id, long idle_ttl_seconds, long max_lifetime_seconds, sbx_info_t *out,
                err_t *err);

/* Records the stored snapshot version `gen` of sandbox `id` (see
 * sbx_info_t.store_gen); nothing when it is gone. */
void sbx_set_store_gen (sbx_runtime_t *rt, const char *id, const char *gen);

/* Describes every sandbox, ordered by id. *out is freed by the caller. */
int sbx_list (sbx_runtime_t *rt, sbx_info_t **out, size_t *n, err_t *err);

/* As sbx_list, only the sandboxes whose labels `match` says yes to (NULL:
 * all; called under the registry lock: it must not block), each with a
 * copy of its labels in .labels (NULL: none): free each, then *out. */
typedef bool (*sbx_match_fn) (void *ctx, const char *const *labels);
int sbx_list_matching (sbx_runtime_t *rt, sbx_match_fn match, void *ctx, sbx_info_t **out, size_t *n, err_t *err);

typedef struct sbx_exec_req_s
{
  const char *id;
  char *const *argv; /* NULL-terminated, at least one element */
  char *const *env;  /* "KEY=VALUE", NULL-terminated, may be NULL */
  const char *cwd;   /* absolute; NULL or "": /root */
  const uint8_t *stdin_data;
  size_t stdin_len;
  /* stdin comes from the caller as it goes (stdin_data is then unused):
   * the write end of the command's stdin is handed over through
   * sink->started, and EOF is the caller closing it. */
  bool stdin_stream;
  /* Both > 0: the command runs on a pseudo-terminal this size (stdin,
   * stdout and stderr are the terminal; its output comes as stream 1;
   * TERM defaults to xterm-256color). Needs stdin_stream. */
  uint16_t pty_rows, pty_cols;
  uint32_t timeout_seconds; /* 0: default */
  bool no_timeout;          /* no deadline at all (detached processes) */
  /* A detached process: it does not keep the sandbox from idling (unless
   * idle_counts_processes). */
  bool background;
  /* Runs as uid:gid (the sandbox's own ids; an image's User) instead of
   * the sandbox's root. */
  bool as_user;
  uint32_t uid, gid;
} sbx_exec_req_t;

/* What a started command hands its caller; the descriptors are the
 * caller's to close. */
typedef struct sbx_exec_started_s
{
  int pid;      /* in the sandbox's pid namespace */
  int pidfd;    /* of the command, -1 when the kernel has none: signals go
                   to its process group (sbx_exec_signal) */
  int stdin_fd; /* with stdin_stream, else -1; blocking */
  int pty_fd;   /* the terminal's master (for its size), else -1 */
} sbx_exec_started_t;

typedef struct sbx_exec_result_s sbx_exec_result_t;

/* Where an exec's output goes, as it is produced. */
typedef struct sbx_exec_sink_s
{
  /* stream 1 = stdout, 2 = stderr; at most SBX_EXEC_CHUNK bytes. Returns
   * -1 when the consumer is gone (the command is then killed). May block:
   * that is the flow control. `data` is lent: a sink that passes it on
   * without copying keeps it with sbx_exec_hold. */
  int (*output) (void *ctx, int stream, const uint8_t *data, size_t len);
  /* True when the consumer has gone away (polled a few times a second). */
  bool (*cancelled) (void *ctx);
  /* May be NULL. A sink whose `output` does not block (it starts a send
   * and returns) says here, waiting at most wait_ms, whether the last one
   * has gone: 1 yes, 0 not yet (the exec reads no more output meanwhile:
   * the command's pipes fill and it waits, while the deadline and
   * cancellation keep counting), -1 the consumer is gone. */
  int (*ready) (void *ctx, int wait_ms);
  /* Told once the command runs (may be NULL: the descriptors are then
   * closed). Called on the exec's thread, before any output. */
  void (*started) (void *ctx, const sbx_exec_started_t *st);
  void *ctx;
} sbx_exec_sink_t;

/* Keeps an output buffer given to a sink past the sink's return, until
 * sbx_exec_release (any thread): the exec then reads into another one. */
void sbx_exec_hold (const uint8_t *data);
void sbx_exec_release (const uint8_t *data);
/* Bytes of exec output buffers counted against
 * sbx_config_t.exec_buffer_total_bytes, in the whole process. */
size_t sbx_exec_buffered_bytes (void);

struct sbx_exec_result_s
{
  int exit_code; /* -1 when killed by a signal */
  int signal;
  bool timed_out;
  bool cancelled;
  bool oom_killed;
  bool pids_limited; /* the process limit refused a fork during the command */
  uint64_t duration_ms;
  char message[256]; /* detail for an abnormal end */
};

/* An exec whose command has ended, not yet cleaned up (sbx_exec_run). */
typedef struct sbx_exec_s sbx_exec_t;

/* Runs a command in a sandbox, streaming its output to `sink`, until it
 * has ended and its output is drained: *res is then final and the caller
 * may answer, before sbx_exec_finish cleans up (the exec's cgroup, the
 * sandbox's hold), which it must call once with *out. Returns 0 when the
 * command ran (whatever its exit status), -1 with *err when it could not
 * be run (ENOENT unknown sandbox, EINVAL bad request; *out NULL, nothing
 * to finish). `req` and `sink` stay the caller's and must live until
 * sbx_exec_finish. */
int sbx_exec_run (sbx_runtime_t *rt, const sbx_exec_req_t *req, const sbx_exec_sink_t *sink, sbx_exec_result_t *res,
                  sbx_exec_t **out, err_t *err);
/* Cleans up after sbx_exec_run and frees `x` (NULL: nothing). */
void sbx_exec_finish (sbx_exec_t *x);

/* sbx_exec_run then sbx_exec_finish, for a caller that answers after the
 * clean-up. */
int sbx_exec (sbx_runtime_t *rt, const sbx_exec_req_t *req, const sbx_exec_sink_t *sink, sbx_exec_result_t *res,
              err_t *err);

/* A started command's input, on the descriptors sbx_exec_started_t hands
 * over (or duplicates of them), shared by Run and detached processes:
 * write: all of `data`, waiting while the pipe or terminal is full (the
 * descriptor is non-blocking); ECANCELED once `wake` is readable, EPIPE
 * when nobody reads it any more. end_input_pty: the terminal's EOF
 * character (closing a master would hang the terminal up). resize: the
 * terminal's size (its foreground job gets SIGWINCH). */
int sbx_exec_write (int fd, const uint8_t *data, size_t len, int wake, err_t *err);
int sbx_exec_end_input_pty (int pty_fd, int wake, err_t *err);
int sbx_exec_resize (int pty_fd, uint16_t rows, uint16_t cols, err_t *err);

/* Sends `sig` to the process group of a started command (its pidfd).
 * ESRCH once it has exited, EINVAL for a signal number Linux has not. */
int sbx_exec_signal (int pidfd, int sig, err_t *err);

/* Detached processes (proc.c): commands that outlive the call that started
 * them, their output kept in ring buffers for any number of attachers. */
typedef struct sbx_proc_s sbx_proc_t;

/* Starts a detached process (req->stdin_stream and the pty as given; its
 * id `proc_id`, or a generated one when NULL or empty) and returns it held
 * (sbx_proc_put) once it runs. EINVAL bad id, EEXIST id taken, EAGAIN
 * SANDBOX_MAX_PROCESSES running, ENOENT no sandbox. */
int sbx_proc_start (sbx_runtime_t *rt, const sbx_exec_req_t *req, const char *proc_id, sbx_proc_t **out, err_t *err);
/* Holds process `proc_id` of sandbox `sid`. ENOENT unknown. */
int sbx_proc_attach (sbx_runtime_t *rt, const char *sid, const char *proc_id, sbx_proc_t **out, err_t *err);
void sbx_proc_put (sbx_runtime_t *rt, sbx_proc_t *p);

/* Where one attacher is in the process's output. */
typedef struct sbx_proc_cursor_s
{
  uint64_t out, err;
} sbx_proc_cursor_t;
/* From the oldest byte kept (`replay`) or from now. */
void sbx_proc_cursor_start (sbx_runtime_t *rt, sbx_proc_t *p, bool replay, sbx_proc_cursor_t *c);
/* The next output for cursor `c`: >0 bytes of *stream (1 or 2); 0 when the
 * process has exited and everything was read (*res set); -1 when nothing
 * came within timeout_ms. */
int sbx_proc_read (sbx_runtime_t *rt, sbx_proc_t *p, sbx_proc_cursor_t *c, uint8_t *buf, size_t cap, int *stream,
                   int timeout_ms, sbx_exec_result_t *res);
/* Its stdin (waits while full; `wake` readable gives up with ECANCELED;
 * EPIPE once closed), end of input (the EOF character on a terminal),
 * its terminal's size, a signal to its process group (EBUSY once exited). */
int sbx_proc_write (sbx_runtime_t *rt, sbx_proc_t *p, const uint8_t *data, size_t len, int wake, err_t *err);
void sbx_proc_end_input (sbx_runtime_t *rt, sbx_proc_t *p, int wake);
int sbx_proc_resize (sbx_runtime_t *rt, sbx_proc_t *p, uint16_t rows, uint16_t cols, err_t *err);
int sbx_proc_signal_proc (sbx_runtime_t *rt, sbx_proc_t *p, int sig, err_t *err);
int sbx_proc_signal (sbx_runtime_t *rt, const char *sid, const char *proc_id, int sig, err_t *err);

typedef struct sbx_proc_info_s
{
  char id[SBX_ID_MAX + 1];
  int pid;
  char *const *argv; /* valid while the process is held */
  uint16_t rows, cols;
  bool running, exited;
  sbx_exec_result_t res; /* once exited */
  int64_t started_at_ms;
  uint64_t dropped_bytes; /* output the ring buffers lost */
} sbx_proc_info_t;
void sbx_proc_info (sbx_runtime_t *rt, sbx_proc_t *p, sbx_proc_info_t *out);
/* The processes of sandbox `sid`, oldest first, each held (put each, free
 * the array). ENOENT no sandbox. */
int sbx_proc_list (sbx_runtime_t *rt, const char *sid, sbx_proc_t ***out, size_t *n, err_t *err);

/* The file API (files.c). Every operation runs inside the sandbox, in a
 * child of its pid 1 (see wire.h, "File requests"): paths are the
 * sandbox's, relative ones from /root, and the gateway never resolves one.
 * An operation in flight: */
typedef struct sbx_file_s sbx_file_t;

/* Most directories one Watch call watches (recursive). */
#define SBX_WATCH_MAX_DIRS 8192
/* Most levels ListDir descends. */
#define SBX_LIST_MAX_DEPTH 64

typedef struct sbx_file_req_s
{
  const char *id;
  sbx_file_op_t op;
  const char *path;
  const char *path2;       /* rename's destination, else NULL */
  uint32_t flags;          /* SBX_FILE_F_* */
  uint32_t mode;           /* write, mkdir: permission bits (07777), 0 the default */
  uint32_t depth;          /* list */
  uint64_t offset, length; /* read; list: offset = entries to skip (earlier pages) */
  /* An image's User: the operation runs as uid:gid (the sandbox's own ids,
   * no supplementary groups); else as the sandbox's root. */
  bool as_user;
  uint32_t uid, gid;
} sbx_file_req_t;

/* An answer of the operation, valid until the next call on it. Strings are
 * NUL-terminated; what they hold comes from inside the sandbox. */
typedef struct sbx_file_msg_s
{
  sbx_frame_kind_t kind; /* DATA, INFO or EVENT */
  const uint8_t *data;   /* DATA */
  size_t len;
  sbx_file_wire_t info;   /* INFO */
  sbx_event_wire_t event; /* EVENT */
  const char *path;       /* INFO, EVENT */
  const char *target;     /* INFO: a symlink's target; EVENT: the old path of a rename */
} sbx_file_msg_t;

/* Whether the caller has gone (polled while waiting). */
typedef bool (*sbx_gone_fn) (void *ctx);

/* Starts operation `req`. EINVAL bad request (empty path), ENOENT no such
 * sandbox, EAGAIN SANDBOX_MAX_WATCHES watches running. */
int sbx_file_start (sbx_runtime_t *rt, const sbx_file_req_t *req, sbx_gone_fn gone, void *gone_ctx, sbx_file_t **out,
                    err_t *err);
/* The next answer: 1 with *msg, 0 at the end (END), -1 with *err: the
 * operation's own error (its errno: ENOENT, EISDIR, ENOSPC…), ECANCELED
 * once `gone`, EIO when it ended without an answer. A DATA message's bytes
 * are lent as an exec's output is: kept past the next call only with
 * sbx_exec_hold. */
int sbx_file_next (sbx_file_t *f, sbx_file_msg_t *msg, err_t *err);
/* Write: the next bytes (`n` spans, any size), and their end. Waits while
 * the operation is behind (flow control). A write that failed inside the
 * sandbox (ENOSPC…) fails here with its error. */
int sbx_file_send (sbx_file_t *f, const struct iovec *iov, int n, err_t *err);
int sbx_file_send_end (sbx_file_t *f, err_t *err);
/* Ends the operation: a finished one is waited for; one still running
 * (the caller gave up) is told to stop, then killed with all it started.
 * NULL is ignored. */
void sbx_file_close (sbx_file_t *f);

/* The host path of a volume spec ("host:sandbox[:…]"), copied into buf
 * (cap bytes, truncated): buf. */
const char *sbx_volume_host (const char *spec, char *buf, size_t cap);

/* Number of live sandboxes (launching ones included). */
size_t sbx_count (sbx_runtime_t *rt);
/* Number of ready sandboxes in the warm pool (pool.c). */
size_t sbx_pool_count (sbx_runtime_t *rt);
/* Parses SANDBOX_WARM_POOL ("default=N", N at most SBX_POOL_MAX; NULL or
 * "" is 0) into *out; EINVAL naming the bad part (templates and image
 * references are refused). */
int sbx_pool_parse (const char *text, long *out, err_t *err);

/* The runtime's configuration. */
const sbx_config_t *sbx_runtime_config (const sbx_runtime_t *rt);
/* Whether the runtime can still do its job: its image is a directory, its
 * state directory takes files, its cgroup hierarchies are there. -1 with
 * *err naming what fails. */
int sbx_runtime_check (sbx_runtime_t *rt, err_t *err);

/* ---- ports (ports.c): servers inside a sandbox ---------------------------- */

/* Connects to TCP `port` on sandbox `id`'s loopback (127.0.0.1, else
 * [::1]), inside its network namespace. *fd (non-blocking, CLOEXEC) is the
 * caller's. ENOENT unknown sandbox, EINVAL bad port, ENOTCONN nothing
 * listens there, ETIMEDOUT the connection is not accepted in time. */
int sbx_port_connect (sbx_runtime_t *rt, const char *id, unsigned port, int *fd, err_t *err);

/* Makes, unless there is one, the socket sandbox `id`'s next
 * sbx_port_connect takes instead of entering its network namespace then
 * (a thread's start and a setns). Best effort; for a caller whose own
 * connection is made and whose server is busy with it. */
void sbx_port_prepare (sbx_runtime_t *rt, const char *id);

/* Renews sandbox `id`'s idle timer (a forwarded connection in use). */
void sbx_port_touch (sbx_runtime_t *rt, const char *id);

/* A TCP socket listening in a sandbox. */
typedef struct sbx_port_s
{
  unsigned port;
  char address[46]; /* as text */
  bool loopback_only;
  bool ipv6;
  int pid; /* its owner, as seen inside the sandbox; 0 unknown */
  unsigned long inode;
} sbx_port_t;

/* Lists sandbox `id`'s listening TCP sockets, ordered by port. *out is
 * freed by the caller. ENOENT unknown sandbox. */
int sbx_port_list (sbx_runtime_t *rt, const char *id, sbx_port_t **out, size_t *n, err_t *err);

/* Runs fn(arg) on a thread of its own inside sandbox `id`'s network
 * namespace, and waits for it. What the thread creates keeps that
 * namespace (sockets; threads it starts, which stay in it for their whole
 * life). ENOENT unknown sandbox. */
int sbx_netns_run (sbx_runtime_t *rt, const char *id, void (*fn) (void *arg), void *arg, err_t *err);

#endif
