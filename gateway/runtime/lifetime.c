/* runtime/lifetime: how long a sandbox lives — its idle TTL (its launch's,
 * else SANDBOX_IDLE_TTL), its most lifetime, Extend, and which sandbox the
 * idler (reaper.c) ends next and how: persisted first through the expiry
 * hook (the snapshot layer's, gateway/snapshot/expire.c), or deleted.
 * Every time is on the monotonic clock; clients see wall-clock times.
 *
 * Threading: the lifetime fields of a sandbox live under rt->mu; nothing
 * here does I/O under it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gateway/runtime/internal.h"

void
sbx_set_expire_hook (sbx_runtime_t *rt, sbx_expire_fn fn, void *ctx)
{
  pthread_mutex_lock (&rt->mu);
  rt->expire = fn;
  rt->expire_ctx = ctx;
  pthread_mutex_unlock (&rt->mu);
}

void
sbx_lifetime_set_locked (sbx_t *s, const sbx_lifetime_t *life)
{
  s->life = *life;
  s->end_of_life_ms = life->max_lifetime_seconds > 0 ? sbx_mono_ms () + life->max_lifetime_seconds * 1000 : 0;
}

/* Wall-clock time of monotonic `mono` for `s`. */
static int64_t
wall_of (const sbx_t *s, int64_t mono)
{
  return s->created_ms + (mono - s->created_mono_ms);
}

int64_t
sbx_expires_at_locked (const sbx_t *s)
{
  int64_t at = 0;
  if (s->life.idle_ttl_seconds > 0)
    at = wall_of (s, s->last_used_ms + s->life.idle_ttl_seconds * 1000);
  if (s->end_of_life_ms > 0)
    {
      int64_t end = wall_of (s, s->end_of_life_ms);
      at = at == 0 || end < at ? end : at;
    }
  return at;
}

bool
sbx_find_expired_locked (sbx_runtime_t *rt, char id[SBX_ID_MAX + 1], const char **why, bool *persist)
{
  int64_t now = sbx_mono_ms ();
  for (sbx_t *s = rt->list; s != NULL; s = s->next)
    {
      if (!s->ready || s->deleting || s->expiring || s->dead)
        continue;
      bool ended = s->end_of_life_ms > 0 && now >= s->end_of_life_ms;
      int64_t ttl_ms = s->life.idle_ttl_seconds * 1000;
      bool idle = ttl_ms > 0 && s->refs - (rt->cfg.idle_counts_processes ? 0 : s->bg_refs) == 0
                  && now - s->last_used_ms >= ttl_ms;
      if (!ended && !idle)
        continue;
      snprintf (id, SBX_ID_MAX + 1, "%s", s->id);
      *why = ended ? "max_lifetime" : "idle";
      *persist = s->life.persist_on_expiry && rt->expire != NULL;
      s->expiring = true;
      return true;
    }
  return false;
}

int
sbx_extend (sbx_runtime_t *rt, const char *id, long idle_ttl_seconds, long max_lifetime_seconds, sbx_info_t *out,
            err_t *err)
{
  const sbx_config_t *c = &rt->cfg;
  if (idle_ttl_seconds < 0 || idle_ttl_seconds > c->max_idle_ttl_seconds)
    return err_make (err, EINVAL, "idle_ttl_seconds %ld is above the maximum of %ld (SANDBOX_MAX_IDLE_TTL)",
                     idle_ttl_seconds, c->max_idle_ttl_seconds);
  if (max_lifetime_seconds < 0 || max_lifetime_seconds > c->max_lifetime_seconds)
    return err_make (err, EINVAL, "max_lifetime_seconds %ld is above the maximum of %ld (SANDBOX_MAX_LIFETIME)",
                     max_lifetime_seconds, c->max_lifetime_seconds);
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  sbx_t *s = sbx_acquire (rt, id); /* renews its idle timer */
  if (s == NULL)
    return sbx_err_not_found (err, id, NULL);
  pthread_mutex_lock (&rt->mu);
  int rc = 0;
  if (s->expiring)
    rc = sbx_err_not_found (err, id, ": it has expired and is being ended");
  else
    {
      if (idle_ttl_seconds > 0)
        s->life.idle_ttl_seconds = idle_ttl_seconds;
      if (max_lifetime_seconds > 0)
        {
          s->life.max_lifetime_seconds = max_lifetime_seconds;
          s->end_of_life_ms = sbx_mono_ms () + max_lifetime_seconds * 1000;
        }
      s->last_used_ms = sbx_mono_ms ();
    }
  pthread_mutex_unlock (&rt->mu);
  sbx_release (rt, s);
  return rc < 0 ? -1 : sbx_get (rt, id, out, err);
}
