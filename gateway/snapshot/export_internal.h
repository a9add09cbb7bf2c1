/* snapshot/export_internal: what the export's two files share — the
 * export's state (export_t), the names of the OCI layer format, and the
 * writers of single entries (entries.c) the walk (export.c) calls.
 * State: per export; one export per thread. */
#ifndef SBX_GATEWAY_SNAPSHOT_EXPORT_INTERNAL_H
#define SBX_GATEWAY_SNAPSHOT_EXPORT_INTERNAL_H

#include <archive.h>
#include <archive_entry.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/stat.h>

#include "gateway/snapshot/export.h"
#include "gateway/snapshot/links.h"

#define OCI_WHITEOUT ".wh."
#define OCI_OPAQUE ".wh..wh..opq"
/* A name of the sandbox's own that begins with the whiteout prefix is
 * stored with this before it, so it is never taken for a whiteout or the
 * opaque marker (".wh.x" -> ".wh..wh.u.wh.x"; the ".wh..wh." space is
 * reserved by the OCI layer format). Restore strips it (unpack.c). */
#define ESCAPE_PREFIX ".wh..wh.u"
#define ESCAPE_LEN (sizeof ESCAPE_PREFIX - 1)

/* Buffers going round between the walk and the stream thread. */
#define EXPORT_BUFFERS 3

typedef struct export_buf_s
{
  struct export_stream_s *st;
  size_t len;
  unsigned holds; /* the stream thread's while the sink has it, and the sink's own */
  uint8_t data[];
} export_buf_t;

/* On the heap: a buffer a sink keeps (snap_export_hold) may come back after
 * the export has returned, and then finds the stream here to free itself. */
typedef struct export_stream_s
{
  export_buf_t *queue[EXPORT_BUFFERS]; /* filled, oldest at q_head */
  size_t q_head, n_queued;
  export_buf_t *free_[EXPORT_BUFFERS];
  size_t n_free;
  export_buf_t *cur; /* the walk's buffer; NULL none */
  unsigned live;     /* buffers allocated and not yet freed */
  bool done, failed, started, closed;
  const atomic_bool *abort;
  err_t err; /* the sink's, once it failed */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
} export_stream_t;

/* One directory on the walk's stack: its entries, sorted, and where the
 * walk is in them. The walk is iterative: however deep a sandbox nests its
 * directories, the stack is on the heap and bounded by PATH_MAX. */
typedef struct frame_s
{
  int fd;     /* the directory, opened O_NOFOLLOW */
  size_t len; /* length of its path in x->path */
  char **names;
  size_t n, next;
  uint32_t node; /* its node in the link table; 0 none yet (or the root) */
} frame_t;

typedef struct export_s
{
  struct archive *a;
  /* stream side */
  snap_sink_fn sink;
  void *sink_ctx;
  uint8_t *buf; /* the walk's current buffer (the stream's) */
  size_t used, chunk;
  export_stream_t *stream;
  EVP_MD_CTX *sha; /* NULL: no digest */
  uint64_t total;
  err_t *err;
  bool failed;
  /* tree side */
  snap_links_t links;
  frame_t *stack; /* the walk's directories, root first */
  size_t depth;
  char *link_path; /* a hard link's target being written (PATH_MAX + 1 bytes) */
  uint64_t entries;
  /* cancellation */
  const atomic_bool *abort;
  bool (*cancelled) (void *ctx);
  void *cancelled_ctx;
  unsigned checks; /* export_check calls, to ask `cancelled` one time in EXPORT_CANCEL_POLL */
  uint8_t *io;
  char *path;           /* the entry being written (PATH_MAX + 1 bytes) */
  const uint8_t *holes; /* EXPORT_HOLE_CHUNK bytes, never touched */
  /* the layer's own */
  uint32_t id_base, id_range; /* see snap_layer_t */
  const char *overlay_xattrs; /* overlay's private prefix: "trusted.overlay." or "user.overlay." */
  const char *opaque_xattr;   /* its opaque mark */
} export_t;

/* Holes between a file's data regions are handed to the archive from one
 * untouched anonymous mapping (address space, no memory): the pax writer
 * skips hole bytes without reading them. It takes at most INT_MAX bytes a
 * call (libarchive's own limit), so a hole costs one call per 2 GiB (about
 * 15 s per EiB on one core); a hole after the last data region costs
 * nothing. */
#define EXPORT_HOLE_CHUNK ((size_t) 0x7ffff000)

/* export_check asks the caller's `cancelled` once in this many calls (the
 * abort flag, an atomic, every time). */
#define EXPORT_CANCEL_POLL 256

/* export_stream.c: the stream thread. start: 0 or -1 (out of memory); finish:
 * waits for what is queued, 0 or -1 when the sink failed (its error moved
 * to *x->err); release frees (finishing first). */
int export_stream_start (export_t *x, const atomic_bool *abort);
int export_stream_finish (export_t *x);
void export_stream_release (export_t *x);
/* libarchive's write and close callbacks (ctx: the export_t): bytes into
 * the current buffer, a full buffer to the stream thread. */
la_ssize_t export_write_cb (struct archive *a, void *ctx, const void *data, size_t len);
int export_close_cb (struct archive *a, void *ctx);

/* export.c: 0, or -1 with ECANCELED in *x->err once the export was told to
 * stop (its abort flag, or its caller's `cancelled`). Every loop of the
 * walk calls it, also those that produce no output (holes, listings). */
int export_check (export_t *x);
/* The link-table node of the directory the walk is in (made, with its
 * parents', when first asked). */
int export_dir_node (export_t *x, uint32_t *out);

/* entries.c */
/* A host id as the sandbox sees it (see snap_layer_t): with a user
 * namespace (range > 0) host ids base..base+range-1 are 0..range-1, host
 * root stays 0, and any other id is nobody; without one, itself. */
#define EXPORT_NOBODY_ID 65534
uint32_t export_inside_id (uint32_t id, uint32_t base, uint32_t range);
/* True when the sandbox's own `name` begins like a whiteout and is stored
 * with ESCAPE_PREFIX before it. */
bool export_name_escaped (const char *name);
int export_fail (export_t *x, const char *what);
void export_set_meta (const export_t *x, struct archive_entry *e, const char *path, const struct stat *st);
/* Copies the extended attributes of `fd`, except overlay's own. */
int export_add_xattrs (export_t *x, struct archive_entry *e, int fd, const char *path);
int export_write_entry (export_t *x, struct archive_entry *e, const char *path);
/* The whiteout of `name` in directory `dir`. */
int export_write_whiteout (export_t *x, const char *dir, const char *name, const struct stat *st);
/* A regular file: its entry and its contents (sparse files as pax sparse
 * entries). A file that changed identity meanwhile is skipped and logged. */
int export_write_file (export_t *x, int dirfd, const char *name, const char *path, const struct stat *st);

#endif
