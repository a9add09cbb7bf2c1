/* runtime/pool: the warm pool (SANDBOX_WARM_POOL) — sandboxes of the
 * default image made ahead of launches, each with everything a launch
 * makes (user namespace and uid range, namespaces, cgroups, disk, pid 1
 * ready) and no id: a placeholder name ("_pool-N", which no client id can
 * be) for its state directory and groups, made with the gateway's default
 * resources (and a group in the cpu hierarchy, unlimited unless the
 * default limits it). A launch of the default image without egress claims
 * one: it is renamed to the launch's id (state directory and cgroups,
 * which its pid 1 does not name) and linked into the registry, and its
 * limits and disk size become the launch's (pool_shape.c); launches that
 * find the pool empty, name an image, restore a snapshot or get egress
 * make their own. A pooled sandbox is never in the registry (List and Get
 * do not see it), counts against SANDBOX_MAX beside the live ones, and is
 * never given back: a deleted sandbox is destroyed.
 *
 * Does not own the launch itself (launch.c builds a pooled sandbox the
 * way it builds any) nor the registry.
 *
 * Threading: the pool's fields live in the runtime under rt->mu; one
 * filler thread, niced, makes pooled sandboxes one at a time, at most one
 * every SBX_POOL_REFILL_GAP_MS and SBX_POOL_CLAIM_QUIET_MS after the
 * latest claim, backing off on failure. Claims and the filler never hold
 * rt->mu across I/O. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/path.h"

/* Shortest gap between the starts of two pooled sandboxes: the refill rate
 * is at most 1000 / SBX_POOL_REFILL_GAP_MS a second. */
#define SBX_POOL_REFILL_GAP_MS 10
/* A failing refill waits this long, doubling up to the maximum. */
#define SBX_POOL_BACKOFF_MIN_MS 100
#define SBX_POOL_BACKOFF_MAX_MS 10000
/* The filler's nice value (it and the helpers it starts). */
#define SBX_POOL_NICE 10
/* How long after a claim the refill it caused starts: the claim's answer
 * goes out first, not racing the helper for the CPUs and the kernel's
 * cgroup locks (a claim takes well under a millisecond). Waited once per
 * refill, so claims in a row cannot keep the pool empty. */
#define SBX_POOL_CLAIM_QUIET_MS 2

static int
parse_count (const char *key, const char *val, long *out, err_t *err)
{
  char *end = NULL;
  errno = 0;
  long n = strtol (val, &end, 10);
  if (end == val || *end != '\0' || errno != 0 || n < 0 || n > SBX_POOL_MAX)
    return err_make (err, EINVAL, "SANDBOX_WARM_POOL: `%s=%s`: the count must be a number in [0, %d]", key, val,
                     SBX_POOL_MAX);
  *out = n;
  return 0;
}

int
sbx_pool_parse (const char *text, long *out, err_t *err)
{
  *out = 0;
  if (text == NULL || text[0] == '\0')
    return 0;
  cleanup_free char *copy = strdup (text);
  if (copy == NULL)
    return err_make (err, ENOMEM, "out of memory");
  bool seen = false;
  char *save = NULL;
  for (char *tok = strtok_r (copy, ",", &save); tok != NULL; tok = strtok_r (NULL, ",", &save))
    {
      char *eq = strchr (tok, '=');
      if (eq == NULL || eq == tok)
        return err_make (err, EINVAL, "SANDBOX_WARM_POOL: `%s` is not key=count (e.g. default=8)", tok);
      *eq = '\0';
      const char *key = tok, *val = eq + 1;
      if (strncmp (key, "template:", 9) == 0)
        return err_make (err, EINVAL, "SANDBOX_WARM_POOL: `%s`: this gateway has no templates to pool", key);
      if (strcmp (key, "default") != 0)
        return err_make (err, EINVAL,
                         "SANDBOX_WARM_POOL: `%s`: only `default` (the SANDBOX_ROOTFS image) is pooled; image "
                         "references are not",
                         key);
      if (seen)
        return err_make (err, EINVAL, "SANDBOX_WARM_POOL: `default` is given twice");
      seen = true;
      if (parse_count (key, val, out, err) < 0)
        return -1;
    }
  return 0;
}

size_t
sbx_pool_count (sbx_runtime_t *rt)
{
  pthread_mutex_lock (&rt->mu);
  size_t n = rt->pool_n;
  pthread_mutex_unlock (&rt->mu);
  return n;
}

/* A pooled sandbox's record, named "_pool-<n>", with uid range `slot`. */
static sbx_t *
record_new (sbx_runtime_t *rt, unsigned n, long slot, err_t *err)
{
  sbx_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    {
      err_make (err, ENOMEM, "warm pool: out of memory");
      return NULL;
    }
  snprintf (s->id, sizeof s->id, "_pool-%u", n);
  if (sbx_path_fmt (s->state, sizeof s->state, err, "%s/%s", rt->sandboxes_dir, s->id) < 0)
    {
      free (s);
      return NULL;
    }
  s->slirp_exit_fd = -1;
  s->disk_fd = -1;
  s->port_spare = -1;
  s->uid_slot = slot;
  /* The gateway's defaults: a claim changes what its launch asks for. */
  const sbx_config_t *c = &rt->cfg;
  s->res = (sbx_resources_t){
      .memory_mb = c->memory_mb, .cpu_millis = c->cpu_millis, .disk_mb = c->disk_mb, .pids_max = c->pids_max};
  pthread_mutex_init (&s->freeze_mu, NULL);
  return s;
}

/* Destroys a sandbox that is in no list (pooled, or a failed claim's):
 * its processes, groups, state directory, disk and uid range. */
static void
discard (sbx_runtime_t *rt, sbx_t *s, long slot)
{
  sbx_teardown (rt, s->id, s->state, s->holder);
  if (s->disk_fd >= 0)
    close (s->disk_fd);
  pthread_mutex_lock (&rt->mu);
  sbx_uid_release_locked (rt, slot);
  pthread_cond_broadcast (&rt->cv);
  pthread_mutex_unlock (&rt->mu);
  pthread_mutex_destroy (&s->freeze_mu);
  free (s);
}

/* Waits on rt->cv (rt->mu held) until `until` (monotonic ms) at most. */
static void
wait_until_locked (sbx_runtime_t *rt, int64_t until)
{
  struct timespec ts = {.tv_sec = until / 1000, .tv_nsec = (until % 1000) * 1000000};
  pthread_cond_timedwait (&rt->cv, &rt->mu, &ts);
}

size_t
sbx_pool_held_locked (const sbx_runtime_t *rt)
{
  return rt->pool_n + rt->pool_building + rt->pool_yielded;
}

/* Whether the filler should make another (rt->mu held). */
static bool
want_more_locked (const sbx_runtime_t *rt)
{
  size_t have = rt->pool_n + rt->pool_building;
  return (long) have < rt->cfg.warm_pool && (long) (rt->count + sbx_pool_held_locked (rt)) < rt->cfg.max_sandboxes;
}

/* Makes one pooled sandbox (rt->mu held, dropped meanwhile): 0 made or
 * stopping, -1 it failed (*err says why). */
static int
fill_one_locked (sbx_runtime_t *rt, err_t *err)
{
  long slot = -1;
  if (rt->cfg.userns && (slot = sbx_uid_take_locked (rt)) < 0)
    return err_make (err, EUSERS, "no free uid range for a pooled sandbox");
  rt->pool_building++;
  unsigned n = rt->pool_seq++;
  pthread_mutex_unlock (&rt->mu);
  sbx_t *s = record_new (rt, n, slot, err);
  int rc = s != NULL ? sbx_launch_build (rt, s, err) : -1;
  if (rc == 0)
    sbx_launch_counters (rt, s->id, &s->cg_seen); /* read here, not in its claim */
  pthread_mutex_lock (&rt->mu);
  rt->pool_building--;
  if (rc == 0 && !rt->stopping && rt->pool_n < SBX_POOL_MAX)
    {
      rt->pool[rt->pool_n++] = s;
      return 0;
    }
  pthread_mutex_unlock (&rt->mu);
  if (s != NULL)
    discard (rt, s, slot);
  else
    {
      pthread_mutex_lock (&rt->mu);
      sbx_uid_release_locked (rt, slot);
      pthread_mutex_unlock (&rt->mu);
    }
  pthread_mutex_lock (&rt->mu);
  return rc;
}

void *
sbx_pool_filler_main (void *arg)
{
  sbx_runtime_t *rt = arg;
  /* Low priority: a launch that waits for the CPU is worse than a pool
   * that refills later. Linux's nice is per thread; the helpers this
   * thread starts inherit it. */
  setpriority (PRIO_PROCESS, (id_t) syscall (SYS_gettid), SBX_POOL_NICE);
  int64_t backoff = 0, next = 0;
  bool quiet_waited = false;
  err_t err = ERR_INIT;
  pthread_mutex_lock (&rt->mu);
  while (!rt->stopping)
    {
      if (!want_more_locked (rt))
        {
          pthread_cond_wait (&rt->cv, &rt->mu); /* claims, deletes and stop signal it */
          continue;
        }
      int64_t now = sbx_mono_ms (), quiet = rt->pool_claim_ms + SBX_POOL_CLAIM_QUIET_MS;
      if (now < next || (!quiet_waited && now < quiet))
        {
          quiet_waited = quiet_waited || now >= next;
          wait_until_locked (rt, now < next ? next : quiet);
          continue;
        }
      quiet_waited = false;
      int rc = fill_one_locked (rt, &err);
      if (rc == 0)
        backoff = 0;
      else
        {
          if (backoff == 0)
            err_warn_release (&err, "make a pooled sandbox (retried with back-off)");
          err_release (&err);
          backoff = backoff == 0 ? SBX_POOL_BACKOFF_MIN_MS
                                 : (backoff * 2 > SBX_POOL_BACKOFF_MAX_MS ? SBX_POOL_BACKOFF_MAX_MS : backoff * 2);
        }
      next = sbx_mono_ms () + (backoff > 0 ? backoff : SBX_POOL_REFILL_GAP_MS);
    }
  pthread_mutex_unlock (&rt->mu);
  return NULL;
}

/* Whether the pid 1 of pooled `s` has ended (rt->mu held; not reaped). */
static bool
holder_gone_locked (const sbx_t *s)
{
  siginfo_t si = {0};
  return waitid (P_PID, (id_t) s->holder, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == s->holder;
}

/* Renames the state directory and groups of claimed `s` from `old` to its
 * id. */
static int
rename_claimed (sbx_runtime_t *rt, sbx_t *s, const char *old, const char *old_state, err_t *err)
{
  if (rename (old_state, s->state) < 0)
    return err_make_sys (err, errno, "claim a pooled sandbox: rename `%s`", old_state);
  for (size_t i = 0; i < rt->cg.n; i++)
    {
      char from[SBX_CG_PATH_MAX], to[SBX_CG_PATH_MAX];
      if (sbx_cg_path (from, sizeof from, rt->cg.roots[i], old, NULL, NULL, err) < 0
          || sbx_cg_path (to, sizeof to, rt->cg.roots[i], s->id, NULL, NULL, err) < 0)
        return -1;
      /* No group in the v1 cpu hierarchy: a sandbox without a CPU limit. */
      if (rename (from, to) < 0 && !(errno == ENOENT && (int) i == rt->cg.cpu && !rt->cg.v2))
        return err_make_sys (err, errno, "claim a pooled sandbox: rename cgroup `%s`", from);
    }
  return 0;
}

/* Undoes a claim that failed half way: the sandbox goes, under whichever
 * names its parts have. */
static void
claim_failed (sbx_runtime_t *rt, sbx_t *s, const char *old, const char *old_state)
{
  pthread_mutex_lock (&rt->mu);
  long slot = s->uid_slot;
  s->uid_slot = -1;
  sbx_unlink_locked (rt, s);
  pthread_mutex_unlock (&rt->mu);
  if (s->holder > 0)
    {
      kill (s->holder, SIGKILL);
      sbx_reap (s->holder);
      s->holder = 0;
    }
  err_t e = ERR_INIT;
  if (sbx_cg_kill (&rt->cg, old, NULL, &e) < 0)
    err_release (&e);
  sbx_remove_tree (old_state);
  if (sbx_cg_remove (&rt->cg, old, NULL, &e) < 0)
    err_release (&e);
  discard (rt, s, slot);
}

int
sbx_pool_claim (sbx_runtime_t *rt, const char *id, bool allow_egress, const sbx_image_t *img, bool restore,
                sbx_t **out, err_t *err)
{
  if (img != NULL || restore || (allow_egress && rt->cfg.allow_egress) || rt->cfg.warm_pool == 0
      || !sbx_id_valid (id))
    return 0;
  char new_state[sizeof ((sbx_t *) 0)->state];
  if (sbx_path_fmt (new_state, sizeof new_state, NULL, "%s/%s", rt->sandboxes_dir, id) < 0)
    return 0;
  sbx_t *s = NULL;
  pthread_mutex_lock (&rt->mu);
  while (s == NULL && rt->pool_n > 0 && !rt->stopping && sbx_find_locked (rt, id) == NULL)
    {
      s = rt->pool[--rt->pool_n];
      if (holder_gone_locked (s))
        {
          pthread_mutex_unlock (&rt->mu);
          discard (rt, s, s->uid_slot);
          s = NULL;
          pthread_mutex_lock (&rt->mu);
        }
    }
  char old[SBX_ID_MAX + 1], old_state[sizeof new_state];
  if (s != NULL)
    {
      snprintf (old, sizeof old, "%s", s->id);
      snprintf (old_state, sizeof old_state, "%s", s->state);
      snprintf (s->id, sizeof s->id, "%s", id);
      snprintf (s->state, sizeof s->state, "%s", new_state);
      s->created_ms = sbx_wall_ms ();
      s->created_mono_ms = s->last_used_ms = rt->pool_claim_ms = sbx_mono_ms ();
      sbx_link_locked (rt, s); /* not ready: lookups skip it, a second launch of `id` is refused */
    }
  else
    rt->pool_fallbacks++;
  pthread_cond_broadcast (&rt->cv); /* the filler refills */
  pthread_mutex_unlock (&rt->mu);
  if (s == NULL)
    return 0;
  if (rename_claimed (rt, s, old, old_state, err) < 0)
    {
      claim_failed (rt, s, old, old_state);
      err->status = EIO;
      return -1;
    }
  *out = s;
  return 1;
}

bool
sbx_pool_yield (sbx_runtime_t *rt)
{
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = NULL;
  if (rt->pool_n > 0 && (long) (rt->count + sbx_pool_held_locked (rt)) >= rt->cfg.max_sandboxes)
    {
      s = rt->pool[--rt->pool_n];
      rt->pool_yielded++; /* its place, until the launch reserves */
    }
  pthread_mutex_unlock (&rt->mu);
  if (s != NULL)
    discard (rt, s, s->uid_slot); /* its uid range is free again before the launch takes one */
  return s != NULL;
}

void
sbx_pool_drain (sbx_runtime_t *rt)
{
  for (;;)
    {
      pthread_mutex_lock (&rt->mu);
      sbx_t *s = rt->pool_n > 0 ? rt->pool[--rt->pool_n] : NULL;
      pthread_mutex_unlock (&rt->mu);
      if (s == NULL)
        return;
      discard (rt, s, s->uid_slot);
    }
}
