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

void
sbx_info_copy_locked (sbx_t *s, sbx_info_t *out)
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
  s->refs++; /* keeps the record, its id and its disk descriptor */
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

/* A List copies every record under the registry lock, referenced, and
 * reads the process counts and disks it must after it: the lock every exec
 * takes is never held across those reads, whatever the number of sandboxes.
 * With `labels`, only those `match` (NULL: all) accepts, each with a copy
 * of its labels, made after the lock (the records are referenced and
 * their labels never change). */
static int
list_some (sbx_runtime_t *rt, bool labels, sbx_match_fn match, void *ctx, sbx_info_t **out, size_t *n, err_t *err)
{
  pthread_mutex_lock (&rt->mu);
  size_t cap = rt->count + 1;
  sbx_info_t *v = calloc (cap, sizeof *v);
  cleanup_free sbx_t **held = calloc (cap, sizeof *held);
  cleanup_free bool *read = calloc (cap, sizeof *read);
  if (v == NULL || held == NULL || read == NULL)
    {
      pthread_mutex_unlock (&rt->mu);
      free (v);
      return err_make (err, ENOMEM, "list: out of memory");
    }
  int64_t now = sbx_mono_ms ();
  size_t k = 0;
  for (sbx_t *s = rt->list; s != NULL && k < cap; s = s->next)
    if (s->ready && !s->deleting && (match == NULL || match (ctx, (const char *const *) s->labels)))
      {
        held[k] = s;
        sbx_info_copy_locked (s, &v[k]);
        read[k] = !usage_fresh_locked (s, now);
        if (!read[k])
          {
            v[k].process_count = s->usage_processes;
            v[k].disk_used_bytes = s->usage_disk_used;
            v[k].disk_limit_bytes = s->usage_disk_limit;
          }
        k++;
      }
  pthread_mutex_unlock (&rt->mu);
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
