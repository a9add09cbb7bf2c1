/* snapshot/drain: persisting every live sandbox at shutdown (see drain.h).
 * State: one drain_t on the caller's stack for the length of snap_drain,
 * shared with its workers under its mutex. */
#include "gateway/snapshot/drain.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "common/log.h"
#include "gateway/snapshot/session.h"

typedef struct drain_s drain_t;

/* One worker thread, and the flag that stops the persist it runs. */
typedef struct drain_worker_s
{
  drain_t *d;
  pthread_t thread;
  atomic_bool stop; /* its share or the grace ended, or the sandbox is being deleted */
  /* under d->mu */
  bool busy;        /* a persist is under way */
  bool share_ended; /* it was stopped at the end of its share */
  int64_t start_ms; /* when it began */
} drain_worker_t;

/* On the heap: workers still running past the grace and its margin are
 * left behind (and free it, the last one) rather than joined. */
struct drain_s
{
  sbx_runtime_t *rt;
  snap_store_t *store;
  sbx_info_t *list; /* the sandboxes live when the drain began, in the order they are persisted */
  size_t n;
  int64_t deadline_ms;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* signalled when a worker takes a sandbox, ends one, or ends */
  size_t next;       /* the next sandbox of `list` to persist */
  size_t running;    /* workers that have not ended */
  size_t started;    /* workers started */
  unsigned refs;     /* the caller's, and each running worker's */
  bool over;         /* the deadline passed: no persist begins any more */
  snap_drain_result_t res;
  drain_worker_t workers[SNAP_DRAIN_WORKERS];
};

int64_t
snap_drain_now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The runtime stops a persist whose sandbox is being deleted. */
static void
stop_worker (void *ctx, int status, const char *why)
{
  atomic_store (&((drain_worker_t *) ctx)->stop, true);
}

/* Asked by the export as it walks (also while it sends nothing). */
static bool
worker_stopped (void *ctx)
{
  return atomic_load (&((drain_worker_t *) ctx)->stop);
}

/* Persists run smallest first (the disk the sandbox uses; equal ones, the
 * most recently used first): many small sandboxes are persisted before one
 * large one takes a worker for long. */
static int
persist_order (const void *a, const void *b)
{
  const sbx_info_t *x = a, *y = b;
  if (x->disk_used_bytes != y->disk_used_bytes)
    return x->disk_used_bytes < y->disk_used_bytes ? -1 : 1;
  if (x->last_used_ms != y->last_used_ms)
    return x->last_used_ms > y->last_used_ms ? -1 : 1;
  return strcmp (x->id, y->id);
}

/* When the persist of worker `w` must end, d->mu held: its share of what
 * was left of the grace when it began, (deadline - start) * workers /
 * (workers + sandboxes still waiting), at least SNAP_DRAIN_MIN_SHARE_MS,
 * never past the deadline. The share grows as the queue empties: with
 * nothing waiting, a persist may use the whole rest of the grace. */
static int64_t
share_end_locked (const drain_t *d, const drain_worker_t *w)
{
  int64_t left = d->deadline_ms - w->start_ms;
  if (left <= 0)
    return d->deadline_ms;
  size_t waiting = d->over ? 0 : d->n - d->next;
  size_t workers = d->started > 0 ? d->started : 1;
  int64_t share = left * (int64_t) workers / (int64_t) (workers + waiting);
  if (share < SNAP_DRAIN_MIN_SHARE_MS)
    share = SNAP_DRAIN_MIN_SHARE_MS;
  return share < left ? w->start_ms + share : d->deadline_ms;
}

/* Nobody follows a persist at shutdown but the log. */
static int
no_progress (void *ctx, uint64_t written, err_t *err)
{
  return 0;
}

/* The index of the next sandbox to persist, its stop flag cleared; -1 when
 * none is left or the deadline has passed. Under the mutex, so that the
 * deadline's stop is never cleared by a persist that begins after it. */
static ssize_t
take_next (drain_worker_t *w)
{
  drain_t *d = w->d;
  ssize_t i = -1;
  pthread_mutex_lock (&d->mu);
  w->busy = false;
  if (!d->over && d->next < d->n)
    {
      i = (ssize_t) d->next++;
      atomic_store (&w->stop, false);
      w->busy = true;
      w->share_ended = false;
      w->start_ms = snap_drain_now_ms ();
    }
  pthread_cond_broadcast (&d->cv); /* the queue and this worker's share changed */
  pthread_mutex_unlock (&d->mu);
  return i;
}

static void
log_persisted (const char *id, const snap_persisted_t *done, const char *kind, int64_t ms)
{
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:s, s:s, s:s, s:I, s:I}", "sandbox_id", id, "outcome", "persisted", "store", kind,
                         "object", done->object, "bytes", (json_int_t) done->bytes, "ms", (json_int_t) ms),
              "snapshot persisted at shutdown");
}

static void
log_failed (const char *id, const char *why, const char *error, int64_t ms)
{
  log_fields (SEV_ERROR,
              json_pack ("{s:s, s:s, s:s, s:s, s:I}", "sandbox_id", id, "outcome", "failed", "reason", why, "error",
                         error, "ms", (json_int_t) ms),
              "snapshot not persisted at shutdown: the sandbox's unsaved work is lost");
}

/* Whether a persist that failed ENOENT did so because its sandbox went
 * (rather than, say, a bucket that does not exist). */
static bool
sandbox_gone (sbx_runtime_t *rt, const char *id, const err_t *perr)
{
  if (perr->status != ENOENT)
    return false;
  sbx_info_t info;
  cleanup_err err_t err = ERR_INIT;
  bool gone = sbx_get (rt, id, &info, &err) < 0 && err.status == ENOENT;
  return gone;
}

/* Logs and counts how a persist ended. */
static void
record (drain_worker_t *w, const char *id, int rc, snap_persisted_t *done, const err_t *err, int64_t ms)
{
  drain_t *d = w->d;
  bool gone = rc < 0 && sandbox_gone (d->rt, id, err);
  pthread_mutex_lock (&d->mu);
  bool late = d->over;
  bool share_ended = w->share_ended;
  if (rc == 0)
    {
      d->res.persisted++;
      d->res.bytes += done->bytes;
    }
  else if (gone)
    d->res.deleted++;
  else
    d->res.failed++;
  pthread_mutex_unlock (&d->mu);
  if (rc == 0)
    log_persisted (id, done, d->store->kind, ms);
  else if (gone)
    log_fields (SEV_INFO,
                json_pack ("{s:s, s:s, s:I}", "sandbox_id", id, "outcome", "deleted", "ms", (json_int_t) ms),
                "sandbox deleted during shutdown: not persisted");
  else
    log_failed (id,
                late          ? "cancelled: the shutdown grace ended (SANDBOX_SHUTDOWN_GRACE_SECONDS)"
                : share_ended ? "cancelled: it took longer than its share of the shutdown grace, which the "
                                "sandboxes still waiting needed"
                              : "failed",
                err_msg (err), ms);
}

/* Whether sandbox `id` is a stale copy (snap_copy_stale), as it is now
 * (a call still running may have persisted it since the drain began):
 * logged and counted when it is. A store that cannot tell does not stop
 * the persist. */
static bool
skip_stale (drain_t *d, const char *id)
{
  sbx_info_t info;
  snap_gen_t now;
  cleanup_err err_t err = ERR_INIT;
  int stale = sbx_get (d->rt, id, &info, &err) < 0 ? 0 : snap_copy_stale (d->store, &info, &now, &err);
  if (stale < 0)
    err_warn_release (&err, "persist at shutdown `%s`: cannot compare with the stored snapshot; persisting", id);
  err_release (&err);
  if (stale <= 0)
    return false;
  pthread_mutex_lock (&d->mu);
  d->res.stale++;
  pthread_mutex_unlock (&d->mu);
  log_fields (SEV_WARNING,
              json_pack ("{s:s, s:s, s:s, s:s, s:I}", "sandbox_id", id, "outcome", "stale", "copy_generation",
                         info.store_gen, "stored_generation", now.gen, "stored_at_ms", (json_int_t) now.mtime_ms),
              "not persisted at shutdown: another gateway has persisted `%s` since this copy was restored or "
              "persisted here (a copy left behind when its id moved); the newer snapshot stays",
              id);
  return true;
}

static void
drain_free (drain_t *d)
{
  pthread_cond_destroy (&d->cv);
  pthread_mutex_destroy (&d->mu);
  free (d->list);
  free (d);
}

static void *
worker_main (void *arg)
{
  drain_worker_t *w = arg;
  drain_t *d = w->d;
  ssize_t i;
  while ((i = take_next (w)) >= 0)
    {
      const char *id = d->list[i].id;
      if (skip_stale (d, id))
        continue;
      int64_t t0 = snap_drain_now_ms ();
      snap_persisted_t done = {0};
      cleanup_err err_t err = ERR_INIT;
      snap_canceller_t stop = {stop_worker, w, worker_stopped};
      int rc = snap_persist (d->rt, d->store, id, no_progress, NULL, &stop, &w->stop, &done, &err);
      record (w, id, rc, &done, &err, snap_drain_now_ms () - t0);
      free (done.object);
    }
  pthread_mutex_lock (&d->mu);
  d->running--;
  pthread_cond_broadcast (&d->cv);
  bool last = --d->refs == 0;
  pthread_mutex_unlock (&d->mu);
  if (last)
    drain_free (d);
  return NULL;
}

/* Starts up to SNAP_DRAIN_WORKERS workers (no more than sandboxes);
 * returns how many run. */
static size_t
start_workers (drain_t *d)
{
  size_t want = d->n < SNAP_DRAIN_WORKERS ? d->n : SNAP_DRAIN_WORKERS, k = 0;
  for (; k < want; k++)
    {
      drain_worker_t *w = &d->workers[k];
      w->d = d;
      atomic_init (&w->stop, false);
      pthread_mutex_lock (&d->mu);
      d->running++;
      d->refs++;
      d->started++;
      pthread_mutex_unlock (&d->mu);
      int rc = pthread_create (&w->thread, NULL, worker_main, w);
      if (rc != 0)
        {
          pthread_mutex_lock (&d->mu);
          d->running--;
          d->refs--;
          d->started--;
          pthread_mutex_unlock (&d->mu);
          log_msg (SEV_ERROR, "persist at shutdown: start a worker: %s", strerror (rc));
          break;
        }
    }
  return k;
}

static struct timespec
mono_ts (int64_t ms)
{
  return (struct timespec){(time_t) (ms / 1000), (long) (ms % 1000) * 1000000L};
}

/* Stops the persists that have used their share (share_end_locked), d->mu
 * held; returns the earliest end of a share still running (or the
 * deadline). */
static int64_t
stop_shares_locked (drain_t *d, int64_t now)
{
  int64_t wake = d->deadline_ms;
  for (size_t k = 0; k < d->started; k++)
    {
      drain_worker_t *w = &d->workers[k];
      if (!w->busy || w->share_ended)
        continue;
      int64_t end = share_end_locked (d, w);
      if (now >= end && end < d->deadline_ms)
        {
          w->share_ended = true;
          atomic_store (&w->stop, true);
        }
      else if (end < wake)
        wake = end;
    }
  return wake;
}

/* Waits for the workers until the deadline, stopping each persist at the
 * end of its share; past the deadline, stops every persist under way and
 * any request of the store, and lets no other begin. */
static void
wait_or_stop (drain_t *d)
{
  pthread_mutex_lock (&d->mu);
  for (;;)
    {
      int64_t now = snap_drain_now_ms ();
      if (d->running == 0 || now >= d->deadline_ms)
        break;
      struct timespec until = mono_ts (stop_shares_locked (d, now));
      pthread_cond_timedwait (&d->cv, &d->mu, &until);
    }
  bool late = d->running > 0 || d->next < d->n;
  if (late)
    {
      d->over = true;
      for (size_t k = 0; k < SNAP_DRAIN_WORKERS; k++)
        atomic_store (&d->workers[k].stop, true);
    }
  pthread_mutex_unlock (&d->mu);
  if (late)
    {
      log_msg (SEV_WARNING, "persist at shutdown: the grace ended; cancelling the persists under way");
      if (d->store->ops->cancel_all != NULL)
        d->store->ops->cancel_all (d->store);
    }
}

/* Waits up to SNAP_DRAIN_STOP_MARGIN_MS past the deadline for the workers
 * told to stop; those still running then are left behind (detached: the
 * last frees the drain), each logged, so that the shutdown goes on. */
static void
join_or_leave (drain_t *d)
{
  struct timespec until = mono_ts (d->deadline_ms + SNAP_DRAIN_STOP_MARGIN_MS);
  pthread_mutex_lock (&d->mu);
  while (d->running > 0 && snap_drain_now_ms () < d->deadline_ms + SNAP_DRAIN_STOP_MARGIN_MS)
    pthread_cond_timedwait (&d->cv, &d->mu, &until);
  size_t left = d->running;
  d->res.left_behind = left;
  pthread_mutex_unlock (&d->mu);
  if (left > 0)
    log_fields (SEV_ERROR,
                json_pack ("{s:I, s:i}", "persists", (json_int_t) left, "margin_ms", SNAP_DRAIN_STOP_MARGIN_MS),
                "persist at shutdown: %zu persists did not stop within the margin after the grace; the shutdown goes "
                "on without them",
                left);
  for (size_t k = 0; k < d->started; k++)
    if (left > 0)
      pthread_detach (d->workers[k].thread);
    else
      pthread_join (d->workers[k].thread, NULL);
}

/* Sandboxes whose persist never began: failed too, one line each. */
static void
log_never_begun (drain_t *d)
{
  for (size_t i = d->next; i < d->n; i++)
    log_failed (d->list[i].id, "the shutdown grace ended before its persist began", "not persisted", 0);
  d->res.failed += d->n - d->next;
  d->next = d->n;
}

static void
log_summary (const snap_drain_result_t *r)
{
  log_fields (r->failed > 0 ? SEV_WARNING : SEV_INFO,
              json_pack ("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "sandboxes", (json_int_t) r->sandboxes, "persisted",
                         (json_int_t) r->persisted, "deleted", (json_int_t) r->deleted, "stale",
                         (json_int_t) r->stale, "failed", (json_int_t) r->failed, "bytes", (json_int_t) r->bytes,
                         "elapsed_ms", (json_int_t) r->elapsed_ms),
              "persisted %zu of %zu sandboxes at shutdown", r->persisted, r->sandboxes);
}

/* The workers' part: run them until they end or the deadline. */
static void
run_workers (drain_t *d)
{
  if (snap_drain_now_ms () < d->deadline_ms)
    start_workers (d);
  wait_or_stop (d);
  join_or_leave (d);
}

void
snap_drain (sbx_runtime_t *rt, snap_store_t *store, int64_t deadline_ms, snap_drain_result_t *res)
{
  int64_t t0 = snap_drain_now_ms ();
  drain_t *d = calloc (1, sizeof *d);
  if (d == NULL)
    {
      log_msg (SEV_ERROR, "persist at shutdown: out of memory (no sandbox is persisted)");
      if (res != NULL)
        *res = (snap_drain_result_t){0};
      return;
    }
  *d = (drain_t){.rt = rt, .store = store, .deadline_ms = deadline_ms, .refs = 1};
  cleanup_err err_t err = ERR_INIT;
  if (sbx_list (rt, &d->list, &d->n, &err) < 0)
    {
      err_warn_release (&err, "persist at shutdown: list the sandboxes (none is persisted)");
      d->n = 0;
    }
  if (d->n > 1)
    qsort (d->list, d->n, sizeof *d->list, persist_order);
  d->res.sandboxes = d->n;
  log_fields (SEV_INFO,
              json_pack ("{s:I, s:i, s:I, s:s, s:s}", "sandboxes", (json_int_t) d->n, "workers", SNAP_DRAIN_WORKERS,
                         "budget_ms", (json_int_t) (deadline_ms > t0 ? deadline_ms - t0 : 0), "store", store->kind,
                         "order", "smallest disk first"),
              "persisting every sandbox before shutdown");
  pthread_mutex_init (&d->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&d->cv, &ca);
  pthread_condattr_destroy (&ca);
  if (d->n > 0)
    run_workers (d);
  pthread_mutex_lock (&d->mu);
  d->over = true; /* a worker left behind begins nothing more */
  log_never_begun (d);
  d->res.elapsed_ms = snap_drain_now_ms () - t0;
  snap_drain_result_t r = d->res;
  bool last = --d->refs == 0;
  pthread_mutex_unlock (&d->mu);
  log_summary (&r);
  if (last)
    drain_free (d);
  if (res != NULL)
    *res = r;
}
