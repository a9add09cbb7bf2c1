/* snapshot/session: export, persist, connect and delete of snapshots over
 * the runtime and the store (see session.h). No state. */
#include "gateway/snapshot/session.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/snapshot/record.h"

/* Tries a connect makes while the sandbox changes under it. */
#define CONNECT_ATTEMPTS 3

typedef struct export_job_s
{
  snap_export_opts_t opts;
  snap_sink_fn sink;
  void *ctx;
  snap_export_result_t *res;
  const snap_canceller_t *stop;
  atomic_bool aborted;
} export_job_t;

static int
export_layer (const sbx_layer_t *layer, void *ctx, err_t *err)
{
  export_job_t *j = ctx;
  snap_layer_t l = {.upper_fd = layer->upper_fd,
                    .id_base = layer->uid_base,
                    .id_range = layer->uid_range,
                    .userxattr = layer->userxattr};
  return snap_export (&l, &j->opts, SNAP_CHUNK, j->sink, j->ctx, j->res, err);
}

/* The runtime stops the export: the caller's canceller ends its stream,
 * and the export itself gives up waiting for buffers that stream held. */
static void
stop_export (void *ctx, int status, const char *why)
{
  export_job_t *j = ctx;
  atomic_store (&j->aborted, true);
  j->stop->fn (j->stop->ctx, status, why);
}

int
snap_export_stoppable (sbx_runtime_t *rt, const char *id, const snap_export_opts_t *opts, snap_sink_fn sink,
                       void *ctx, const snap_canceller_t *stop, snap_export_result_t *res, err_t *err)
{
  export_job_t j = {.opts = *opts, .sink = sink, .ctx = ctx, .res = res, .stop = stop};
  atomic_init (&j.aborted, false);
  j.opts.abort = &j.aborted;
  if (stop != NULL && stop->cancelled != NULL)
    {
      j.opts.cancelled = stop->cancelled;
      j.opts.cancelled_ctx = stop->ctx;
    }
  return sbx_with_layer (rt, id, true, export_layer, &j, stop != NULL ? stop_export : NULL, &j, err);
}

int
snap_export_sandbox (sbx_runtime_t *rt, const char *id, snap_compression_t compression, snap_sink_fn sink, void *ctx,
                     snap_export_result_t *res, err_t *err)
{
  snap_export_opts_t opts = {.compression = compression};
  return snap_export_stoppable (rt, id, &opts, sink, ctx, NULL, res, err);
}

typedef struct persist_job_s
{
  snap_store_t *store;
  snap_writer_t *w;
  snap_progress_fn progress;
  void *ctx;
  const atomic_bool *abort;
  uint64_t written;
  uint64_t reported;
} persist_job_t;

static int
persist_sink (void *ctx, const uint8_t *data, size_t len, err_t *err)
{
  persist_job_t *p = ctx;
  if (p->abort != NULL && atomic_load (p->abort))
    return err_make (err, ECANCELED, "persist cancelled after %" PRIu64 " bytes", p->written);
  if (p->store->ops->writer_write (p->w, data, len, err) < 0)
    return -1;
  p->written += len;
  if (p->written - p->reported < SNAP_PROGRESS_EVERY)
    return 0;
  p->reported = p->written;
  return p->progress (p->ctx, p->written, err); /* -1: do not finish its upload */
}

/* Commits the persist's object (the writer is freed either way), unless
 * the persist was cancelled meanwhile (the writer is then left to abort). */
static int
commit_in_layer (const sbx_layer_t *layer, void *ctx, err_t *err)
{
  persist_job_t *p = ctx;
  if (p->abort != NULL && atomic_load (p->abort))
    return err_make (err, ECANCELED, "persist cancelled before its commit, after %" PRIu64 " bytes", p->written);
  snap_writer_t *w = take_ptr (&p->w);
  return p->store->ops->writer_commit (w, err);
}

int
snap_persist (sbx_runtime_t *rt, snap_store_t *store, const char *id, snap_progress_fn progress, void *ctx,
              const snap_canceller_t *stop, const atomic_bool *abort, snap_persisted_t *out, err_t *err)
{
  *out = (snap_persisted_t){0};
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  cleanup_free char *object = snap_object_name (store, id);
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  persist_job_t p = {.store = store, .progress = progress, .ctx = ctx, .abort = abort};
  if (store->ops->writer_open (store, object, &p.w, err) < 0)
    return -1;
  if (snap_export_stoppable (rt, id, &(snap_export_opts_t){.compression = SNAP_COMPRESSION_NONE}, persist_sink, &p,
                             stop, &out->export, err)
      < 0)
    {
      store->ops->writer_abort (p.w);
      return -1;
    }
  /* What it runs on, beside it: a restore from the store puts it back on
   * that image. */
  sbx_info_t info;
  if (sbx_get (rt, id, &info, err) < 0 || snap_record_put (store, object, &info, err) < 0)
    {
      store->ops->writer_abort (p.w);
      return -1;
    }
  /* The object appears only while the sandbox is still there: a Delete
   * that began meanwhile waits for this commit (and then removes the
   * object), or this finds the sandbox gone and drops what it wrote. */
  if (sbx_with_layer (rt, id, false, commit_in_layer, &p, NULL, NULL, err) < 0)
    {
      if (p.w != NULL)
        store->ops->writer_abort (p.w);
      return -1;
    }
  /* The version this copy wrote: a later persist on shutdown checks that
   * nobody has written one since. */
  snap_gen_t gen;
  cleanup_err err_t serr = ERR_INIT;
  if (store->ops->stat (store, object, &gen, &serr) == 1)
    sbx_set_store_gen (rt, id, gen.gen);
  else
    err_warn_release (&serr, "persist `%s`: cannot read back the version written", id);
  out->bytes = p.written;
  out->object = take_ptr (&object);
  return 0;
}

typedef struct store_src_s
{
  snap_store_t *store;
  snap_reader_t *r;
  uint8_t *buf;
} store_src_t;

static int
store_next (void *ctx, struct iovec *iov, int *n, err_t *err)
{
  store_src_t *s = ctx;
  ssize_t got = s->store->ops->reader_read (s->r, s->buf, SNAP_CHUNK, err);
  if (got <= 0)
    return (int) got;
  iov[0] = (struct iovec){s->buf, (size_t) got};
  *n = 1;
  return 1;
}

/* Restores `id` from the store, on the image its record names (or the
 * default image when it has none). ENOENT when there is no snapshot. */
static int
restore_from_store (sbx_runtime_t *rt, snap_store_t *store, const snap_images_t *images, const char *id, bool egress,
                    const snap_gen_t *gen, sbx_info_t *info, err_t *err)
{
  cleanup_free char *object = snap_object_name (store, id);
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  snap_record_t rec;
  int has_image = snap_record_get (store, object, &rec, err);
  if (has_image < 0)
    return err_wrap (err, "restore `%s`", id);
  if (has_image && (images == NULL || images->restore == NULL))
    return err_make (err, ENOTSUP,
                     "restore `%s`: its snapshot was taken on image `%s` (%s), and this gateway has no images", id,
                     rec.ref, rec.digest);
  store_src_t src = {.store = store};
  if (store->ops->reader_open (store, object, &src.r, err) < 0)
    return -1;
  src.buf = malloc (SNAP_CHUNK);
  int rc = src.buf == NULL ? err_make (err, ENOMEM, "out of memory")
           : has_image ? images->restore (images->ctx, id, egress, rec.ref, rec.digest, store_next, &src, info, err)
                       : sbx_restore (rt, id, egress, store_next, &src, info, err);
  free (src.buf);
  store->ops->reader_close (src.r);
  if (rc < 0 && err->status == ENOENT)
    err->status = EIO; /* the snapshot was there: any ENOENT now is a failure */
  if (rc == 0)
    {
      /* The version looked up just before reading: one written in between
       * makes this copy look stale (never newer than it is). */
      sbx_set_store_gen (rt, id, gen->gen);
      snprintf (info->store_gen, sizeof info->store_gen, "%s", gen->gen);
    }
  return rc;
}

int
snap_copy_stale (snap_store_t *store, const sbx_info_t *info, snap_gen_t *now, err_t *err)
{
  cleanup_free char *object = snap_object_name (store, info->id);
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  int exists = store->ops->stat (store, object, now, err);
  if (exists <= 0)
    return exists;
  if (info->store_gen[0] != '\0')
    return strcmp (now->gen, info->store_gen) != 0;
  return now->mtime_ms > info->created_ms;
}

/* A live copy another gateway has persisted past (snap_copy_stale) gives
 * way to the newer snapshot: deleted, then restored from it. 1 done, 0 the
 * copy is current (or the store cannot tell: it stays), -1 failed. */
static int
replace_stale (sbx_runtime_t *rt, snap_store_t *store, const snap_images_t *images, const char *id, bool egress,
               sbx_info_t *info, err_t *err)
{
  snap_gen_t now;
  cleanup_err err_t serr = ERR_INIT;
  int stale = snap_copy_stale (store, info, &now, &serr);
  if (stale < 0)
    err_warn_release (&serr, "connect `%s`: cannot compare with the stored snapshot; the live copy serves", id);
  if (stale <= 0)
    return 0;
  log_fields (SEV_WARNING,
              json_pack ("{s:s, s:s, s:s, s:I}", "sandbox_id", id, "copy_generation", info->store_gen,
                         "stored_generation", now.gen, "stored_at_ms", (json_int_t) now.mtime_ms),
              "sandbox `%s`: another gateway persisted it after this copy was restored or persisted here; the copy "
              "gives way to that snapshot",
              id);
  if (sbx_delete (rt, id, err) < 0 && err->status != ENOENT)
    return -1;
  err_release (err);
  return restore_from_store (rt, store, images, id, egress, &now, info, err) < 0 ? -1 : 1;
}

/* One try: 1 connected (*outcome set), 0 changed meanwhile (try again),
 * -1 failed. */
static int
connect_once (sbx_runtime_t *rt, snap_store_t *store, const snap_images_t *images, const char *id, bool egress,
              bool create, snap_made_fn made, void *ctx, sbx_info_t *info, snap_outcome_t *outcome, err_t *err)
{
  int got = sbx_get (rt, id, info, err);
  if (got == 0 && info->dead)
    {
      /* Its pid 1 died: made again, from its snapshot if it has one. */
      if (sbx_delete (rt, id, err) < 0 && err->status != ENOENT)
        return -1;
      err_release (err);
      return 0;
    }
  if (got == 0)
    {
      int r = replace_stale (rt, store, images, id, egress, info, err);
      if (r < 0)
        return err->status == EEXIST || err->status == ENOENT ? (err_release (err), 0) : -1;
      if (r > 0 && made (ctx, id, err) < 0)
        return -1;
      *outcome = r > 0 ? SNAP_OUTCOME_RESTORED : SNAP_OUTCOME_LIVE;
      return 1;
    }
  err_release (err);
  cleanup_free char *object = snap_object_name (store, id);
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  snap_gen_t gen;
  int exists = store->ops->stat (store, object, &gen, err);
  if (exists < 0)
    return -1;
  if (!exists && !create)
    return sbx_err_not_found (err, id, ", and no stored snapshot");
  int r = exists ? restore_from_store (rt, store, images, id, egress, &gen, info, err)
                 : sbx_launch (rt, id, egress, info, err);
  if (r == 0)
    {
      if (made (ctx, id, err) < 0)
        return -1;
      *outcome = exists ? SNAP_OUTCOME_RESTORED : SNAP_OUTCOME_CREATED;
      return 1;
    }
  /* EEXIST: another call made it meanwhile; ENOENT: its snapshot went. */
  if (err->status == EEXIST || (exists && err->status == ENOENT))
    {
      err_release (err);
      return 0;
    }
  return -1;
}

int
snap_connect (sbx_runtime_t *rt, snap_store_t *store, const snap_images_t *images, const char *id, bool allow_egress,
              bool create, snap_made_fn made, void *ctx, sbx_info_t *info, snap_outcome_t *outcome, err_t *err)
{
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  for (int attempt = 0; attempt < CONNECT_ATTEMPTS; attempt++)
    {
      int r = connect_once (rt, store, images, id, allow_egress, create, made, ctx, info, outcome, err);
      if (r != 0)
        return r > 0 ? 0 : -1;
    }
  return err_make (err, EAGAIN, "connect `%s`: the sandbox keeps changing; try again", id);
}

int
snap_delete_stored (snap_store_t *store, const char *id, bool *deleted, err_t *err)
{
  *deleted = false;
  cleanup_free char *object = snap_object_name (store, id);
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  if (store->ops->remove (store, object, err) < 0)
    {
      if (err->status != ENOENT)
        return -1;
      err_release (err);
      return 0;
    }
  *deleted = true;
  log_fields (SEV_INFO, json_pack ("{s:s, s:s}", "sandbox_id", id, "object", object), "snapshot deleted");
  cleanup_err err_t rerr = ERR_INIT;
  if (snap_record_remove (store, object, &rerr) < 0)
    err_warn_release (&rerr, "delete `%s`: its image record stays", id);
  return 0;
}
