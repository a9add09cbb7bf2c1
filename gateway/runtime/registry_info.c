/* runtime/registry_info: what a record of the registry (registry.c) tells a
 * client — a copy of its fields taken under rt->mu, its process count and
 * disk use read after the lock from the referenced record — and List, which
 * copies every record under one lock and reads their usage after it,
 * reusing a recent reading of a sandbox unused since. It owns no state but
 * the usage a List remembers in each record; it looks nothing up by id.
 *
 * Threading: any thread; rt->mu as each function's name says (_locked:
 * held by the caller), never across a read of a cgroup or a disk. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"

static void info_fill_locked (const sbx_t *s, sbx_info_t *out);

void
sbx_info_copy_locked (sbx_t *s, sbx_info_t *out)
{
  info_fill_locked (s, out);
  s->refs++; /* keeps the record, its id and its disk descriptor */
}

static void
info_fill_locked (const sbx_t *s, sbx_info_t *out)
{
  memset (out, 0, sizeof *out);
  snprintf (out->id, sizeof out->id, "%s", s->id);
  /* Clients see wall-clock times; the idle timer runs on the monotonic
   * clock, so a wall-clock step neither expires nor revives a sandbox. */
  out->created_ms = s->created_ms;
  out->last_used_ms = s->created_ms + (s->last_used_ms - s->created_mono_ms);
  out->allow_egress = s->allow_egress;
  memcpy (out->store_gen, s->store_gen, sizeof out->store_gen);
  out->dead = s->dead;
  memcpy (out->image, s->image, sizeof out->image);
  memcpy (out->image_digest, s->image_digest, sizeof out->image_digest);
  memcpy (out->dead_reason, s->dead_reason, sizeof out->dead_reason);
  out->resources = s->res;
  out->lifetime = s->life;
  out->expires_at_ms = sbx_expires_at_locked (s);
}

void
sbx_info_read_usage (sbx_runtime_t *rt, sbx_t *s, sbx_info_t *out)
{
  long n = sbx_cg_count (&rt->cg, s->id, NULL);
  out->process_count = n > 0 ? n : 0;
  struct statfs sf;
  if (s->disk_fd >= 0 && fstatfs (s->disk_fd, &sf) == 0)
    {
      out->disk_limit_bytes = (uint64_t) sf.f_blocks * (uint64_t) sf.f_bsize;
      out->disk_used_bytes = (uint64_t) (sf.f_blocks - sf.f_bfree) * (uint64_t) sf.f_bsize;
    }
}

void
sbx_info_measure (sbx_runtime_t *rt, sbx_t *s, sbx_info_t *out)
{
  sbx_info_read_usage (rt, s, out);
  pthread_mutex_lock (&rt->mu);
  bool last = sbx_unref_locked (rt, s);
  pthread_mutex_unlock (&rt->mu);
  if (last)
    sbx_free_record (s);
}

static int
info_cmp (const void *a, const void *b)
{
  return strcmp (((const sbx_info_t *) a)->id, ((const sbx_info_t *) b)->id);
}

/* How old a List's figures of an unused sandbox may be (process count,
 * disk use): a List reads them again only for sandboxes used since, or
 * after this long, so a client listing thousands of sandboxes in a loop
 * costs the gateway a copy, not thousands of reads (said in the proto's
 * List comment). */
#define SBX_LIST_USAGE_MAX_AGE_MS 1000

/* Whether s's remembered usage is still a List's answer (rt->mu). */
static bool
usage_fresh_locked (const sbx_t *s, int64_t now)
{
  return s->usage_ms > 0 && s->usage_ms >= s->last_used_ms && now - s->usage_ms < SBX_LIST_USAGE_MAX_AGE_MS;
}

/* Stores what was read into the records, drops the references taken by
 * sbx_info_copy_locked under one lock, and frees the records a delete left
 * to the last of them. */
static void
list_release (sbx_runtime_t *rt, sbx_t **held, const sbx_info_t *v, const bool *read, size_t k, int64_t read_ms)
{
  size_t n_last = 0;
  pthread_mutex_lock (&rt->mu);
  for (size_t i = 0; i < k; i++)
    {
      sbx_t *s = held[i];
      if (read[i])
        {
          s->usage_ms = read_ms;
          s->usage_processes = v[i].process_count;
          s->usage_disk_used = v[i].disk_used_bytes;
          s->usage_disk_limit = v[i].disk_limit_bytes;
        }
      if (sbx_unref_locked (rt, s))
        held[n_last++] = s; /* i >= n_last: the entries left to visit are intact */
    }
  pthread_mutex_unlock (&rt->mu);
  for (size_t i = 0; i < n_last; i++)
    sbx_free_record (held[i]);
}

/* A labels copy that could not be made (sbx_list_matching fails). */
#define SBX_LABELS_OOM ((char **) -1)

/* Records a List copies per hold of the registry lock. */
#define SBX_LIST_BATCH 128
/* Room for sandboxes launched between sizing a List's arrays and taking
 * the lock. */
#define SBX_LIST_MARGIN 64

/* References every live record (those `match` accepts) into *held, sized
 * outside the lock: *k of them. */
static int
hold_live (sbx_runtime_t *rt, sbx_match_fn match, void *ctx, sbx_t ***held, size_t *k, err_t *err)
{
  size_t cap = 0;
  sbx_t **v = NULL;
  for (;;)
    {
      pthread_mutex_lock (&rt->mu);
      size_t live = rt->count;
      if (v != NULL && live <= cap)
        break;
      pthread_mutex_unlock (&rt->mu);
      free (v);
      cap = live + SBX_LIST_MARGIN;
      if ((v = calloc (cap + 1, sizeof *v)) == NULL)
        return err_make (err, ENOMEM, "list: out of memory");
    }
  size_t n = 0;
  for (sbx_t *s = rt->list; s != NULL && n < cap; s = s->next)
    if (s->ready && !s->deleting && (match == NULL || match (ctx, (const char *const *) s->labels)))
      {
        s->refs++; /* keeps the record, its id and its disk descriptor */
        v[n++] = s;
      }
  pthread_mutex_unlock (&rt->mu);
  *held = v;
  *k = n;
  return 0;
}

/* Drops the references hold_live took (a List that cannot go on). */
static void
unhold (sbx_runtime_t *rt, sbx_t **held, size_t k)
{
  size_t n_last = 0;
  pthread_mutex_lock (&rt->mu);
  for (size_t i = 0; i < k; i++)
    if (sbx_unref_locked (rt, held[i]))
      held[n_last++] = held[i];
  pthread_mutex_unlock (&rt->mu);
  for (size_t i = 0; i < n_last; i++)
    sbx_free_record (held[i]);
}

/* A List references every live record under the registry lock (pointers
 * only), then copies them SBX_LIST_BATCH at a time, each batch under the
 * lock, and reads the process counts and disks it must after it: an exec,
 * which takes that lock at its start and end, waits at most for one batch,
 * whatever the number of sandboxes, and never for a read. With `labels`,
 * only those `match` (NULL: all) accepts, each with a copy of its labels,
 * made after the lock (the records are referenced and their labels never
 * change). */
static int
list_some (sbx_runtime_t *rt, bool labels, sbx_match_fn match, void *ctx, sbx_info_t **out, size_t *n, err_t *err)
{
  cleanup_free sbx_t **held = NULL;
  size_t k = 0;
  if (hold_live (rt, match, ctx, &held, &k, err) < 0)
    return -1;
  sbx_info_t *v = calloc (k + 1, sizeof *v);
  cleanup_free bool *read = calloc (k + 1, sizeof *read);
  if (v == NULL || read == NULL)
    {
      free (v);
      unhold (rt, held, k);
      return err_make (err, ENOMEM, "list: out of memory");
    }
  int64_t now = sbx_mono_ms ();
  for (size_t i = 0; i < k; i += SBX_LIST_BATCH)
    {
      pthread_mutex_lock (&rt->mu);
      for (size_t j = i; j < k && j < i + SBX_LIST_BATCH; j++)
        {
          sbx_t *s = held[j];
          info_fill_locked (s, &v[j]);
          read[j] = !usage_fresh_locked (s, now);
          if (!read[j])
            {
              v[j].process_count = s->usage_processes;
              v[j].disk_used_bytes = s->usage_disk_used;
              v[j].disk_limit_bytes = s->usage_disk_limit;
            }
        }
      pthread_mutex_unlock (&rt->mu);
    }
  int64_t read_ms = sbx_mono_ms ();
  for (size_t i = 0; i < k; i++)
    {
      if (read[i])
        sbx_info_read_usage (rt, held[i], &v[i]);
      if (labels && held[i]->labels != NULL && (v[i].labels = sbx_strv_dup (held[i]->labels)) == NULL)
        v[i].labels = SBX_LABELS_OOM;
    }
  list_release (rt, held, v, read, k, read_ms);
  qsort (v, k, sizeof *v, info_cmp);
  *out = v;
  *n = k;
  return 0;
}

int
sbx_list (sbx_runtime_t *rt, sbx_info_t **out, size_t *n, err_t *err)
{
  return list_some (rt, false, NULL, NULL, out, n, err);
}

int
sbx_list_matching (sbx_runtime_t *rt, sbx_match_fn match, void *ctx, sbx_info_t **out, size_t *n, err_t *err)
{
  int rc = list_some (rt, true, match, ctx, out, n, err);
  for (size_t i = 0; rc == 0 && i < *n; i++)
    if ((*out)[i].labels == SBX_LABELS_OOM)
      {
        for (size_t j = 0; j < *n; j++)
          if ((*out)[j].labels != SBX_LABELS_OOM)
            free ((*out)[j].labels);
        free (*out);
        *out = NULL;
        return err_make (err, ENOMEM, "list: out of memory");
      }
  return rc;
}
