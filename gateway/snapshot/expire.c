/* snapshot/expire: persisting an expired sandbox, then deleting it (see
 * expire.h). No state beyond the call. */
#include "gateway/snapshot/expire.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "common/log.h"
#include "gateway/snapshot/session.h"

/* The runtime stops a persist whose sandbox is being deleted meanwhile. */
static void
stop_persist (void *ctx, int status, const char *why)
{
  atomic_store ((atomic_bool *) ctx, true);
}

static bool
persist_stopped (void *ctx)
{
  return atomic_load ((atomic_bool *) ctx);
}

static int
no_progress (void *ctx, uint64_t written, err_t *err)
{
  return 0;
}

static int64_t
mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether `id` is a stale copy, whose newer stored snapshot must stay. */
static bool
stale_copy (sbx_runtime_t *rt, snap_store_t *store, const char *id)
{
  sbx_info_t info;
  snap_gen_t now;
  cleanup_err err_t err = ERR_INIT;
  int stale = sbx_get (rt, id, &info, &err) < 0 ? 0 : snap_copy_stale (store, &info, &now, &err);
  if (stale < 0)
    err_warn_release (&err, "persist expired `%s`: cannot compare with the stored snapshot; persisting", id);
  return stale > 0;
}

void
snap_expire (void *ctx, sbx_runtime_t *rt, const char *id, const char *why)
{
  snap_store_t *store = ctx;
  int64_t t0 = mono_ms ();
  if (stale_copy (rt, store, id))
    log_fields (SEV_WARNING, json_pack ("{s:s, s:s, s:s}", "sandbox_id", id, "reason", why, "outcome", "stale"),
                "expired sandbox not persisted: another gateway has persisted it since (the newer snapshot stays)");
  else
    {
      atomic_bool stop = false;
      snap_canceller_t canceller = {stop_persist, &stop, persist_stopped};
      snap_persisted_t done = {0};
      cleanup_err err_t err = ERR_INIT;
      int rc = snap_persist (rt, store, id, no_progress, NULL, &canceller, &stop, &done, &err);
      json_int_t ms = (json_int_t) (mono_ms () - t0);
      if (rc == 0)
        log_fields (SEV_INFO,
                    json_pack ("{s:s, s:s, s:s, s:s, s:I, s:I}", "sandbox_id", id, "reason", why, "outcome",
                               "persisted", "object", done.object, "bytes", (json_int_t) done.bytes, "ms", ms),
                    "expired sandbox persisted");
      else
        log_fields (SEV_ERROR,
                    json_pack ("{s:s, s:s, s:s, s:s, s:I}", "sandbox_id", id, "reason", why, "outcome", "failed",
                               "error", err_msg (&err), "ms", ms),
                    "expired sandbox not persisted: its unsaved work is lost");
      free (done.object);
    }
  cleanup_err err_t derr = ERR_INIT;
  if (sbx_delete (rt, id, &derr) < 0)
    err_warn_release (&derr, "delete expired `%s`", id);
}
