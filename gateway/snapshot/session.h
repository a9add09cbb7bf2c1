/* snapshot/session: what the snapshot methods do, without protobuf — export
 * a live sandbox's layer (frozen while read), persist it to the store,
 * restore a sandbox from the store, connect (live: renew; stored: restore;
 * neither: create) and delete a stored snapshot. The api layer turns these
 * into gRPC; every stream passes through in bounded pieces.
 *
 * Threading: any thread; the runtime and the store are thread-safe.
 */
#ifndef SBX_GATEWAY_SNAPSHOT_SESSION_H
#define SBX_GATEWAY_SNAPSHOT_SESSION_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "gateway/runtime/runtime.h"
#include "gateway/snapshot/export.h"
#include "gateway/store/store.h"

/* Size of the pieces a snapshot stream is cut into. */
#define SNAP_CHUNK (1024 * 1024)
/* How often a persist reports progress. */
#define SNAP_PROGRESS_EVERY (8ull * 1024 * 1024)

/* Streams sandbox `id`'s layer to `sink`, the sandbox frozen meanwhile. */
int snap_export_sandbox (sbx_runtime_t *rt, const char *id, snap_compression_t compression, snap_sink_fn sink,
                         void *ctx, snap_export_result_t *res, err_t *err);

/* How the caller of an export or persist is told to stop (see
 * sbx_with_layer): a deleted sandbox, a freeze held too long. */
typedef struct snap_canceller_s
{
  sbx_cancel_fn fn;
  void *ctx;
  /* Asked now and then by the export itself, between entries and inside
   * its loops (also those that send nothing): true (the caller went, its
   * deadline passed) stops it with ECANCELED. May be NULL. */
  bool (*cancelled) (void *ctx);
} snap_canceller_t;

/* As snap_export_sandbox, with `opts` (its `abort` is the export's own),
 * stoppable through `stop`. */
int snap_export_stoppable (sbx_runtime_t *rt, const char *id, const snap_export_opts_t *opts, snap_sink_fn sink,
                           void *ctx, const snap_canceller_t *stop, snap_export_result_t *res, err_t *err);

/* Told of the bytes stored so far, every SNAP_PROGRESS_EVERY bytes; -1
 * (the listener is gone) abandons the persist. */
typedef int (*snap_progress_fn) (void *ctx, uint64_t written, err_t *err);

typedef struct snap_persisted_s
{
  char *object; /* owned: free() */
  uint64_t bytes;
  snap_export_result_t export;
} snap_persisted_t;

/* Writes sandbox `id`'s layer to the store under its object name; the
 * object appears only once complete. `abort` (may be NULL), once true
 * (any thread), fails the persist with ECANCELED before its next piece is
 * stored or before its commit, whichever comes first: nothing is
 * committed (a commit already under way completes). */
int snap_persist (sbx_runtime_t *rt, snap_store_t *store, const char *id, snap_progress_fn progress, void *ctx,
                  const snap_canceller_t *stop, const atomic_bool *abort, snap_persisted_t *out, err_t *err);

typedef enum snap_outcome_e
{
  SNAP_OUTCOME_LIVE = 1,
  SNAP_OUTCOME_RESTORED = 2,
  SNAP_OUTCOME_CREATED = 3,
} snap_outcome_t;

/* Called right after connect made a sandbox: -1 undoes it (the caller is
 * gone) and ends the connect with that error. */
typedef int (*snap_made_fn) (void *ctx, const char *id, err_t *err);

/* Whether the live sandbox of `info` is a stale copy: the store holds a
 * version of its snapshot that another copy wrote after this one was
 * restored from or persisted its own (or, for a copy that has neither,
 * written after it was created). 1 stale, 0 not (or no snapshot), -1 the
 * store could not tell; *now is the stored version. */
int snap_copy_stale (snap_store_t *store, const sbx_info_t *info, snap_gen_t *now, err_t *err);

/* Restores `id` from `src` on the image a stored snapshot's record names
 * (snapshot/record.h): the gateway's image side, which this layer does
 * not hold. */
typedef int (*snap_restore_on_image_fn) (void *ctx, const char *id, bool egress, const char *ref, const char *digest,
                                         sbx_source_fn src, void *src_ctx, sbx_info_t *info, err_t *err);
typedef struct snap_images_s
{
  snap_restore_on_image_fn restore; /* NULL: a snapshot on an image cannot be restored (ENOTSUP) */
  void *ctx;
} snap_images_t;

/* Connects to sandbox `id`: live → renewed, or, when it is a stale copy
 * (snap_copy_stale), replaced by the stored snapshot; else restored from its stored
 * snapshot; else created, with `create` (without: ENOENT). EAGAIN when it
 * kept changing under three tries. A snapshot restored from the store goes
 * back on the image its record names, through `images`. */
int snap_connect (sbx_runtime_t *rt, snap_store_t *store, const snap_images_t *images, const char *id,
                  bool allow_egress, bool create, snap_made_fn made, void *ctx, sbx_info_t *info,
                  snap_outcome_t *outcome, err_t *err);

/* Deletes the stored snapshot of `id` (a valid id); *deleted says whether
 * there was one. */
int snap_delete_stored (snap_store_t *store, const char *id, bool *deleted, err_t *err);

#endif
