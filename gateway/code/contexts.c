/* code/contexts: the registry of code contexts — made, found, counted
 * against SANDBOX_MAX_CONTEXTS and SANDBOX_MAX_CONTEXTS_TOTAL, listed,
 * restarted, deleted, and dropped with their sandbox (the runtime's end
 * hook) — and the public
 * calls of kernel.h that act on contexts. The kernels themselves are
 * kernel.c's. Threading: any thread; reg_mu guards the list and the
 * reference counts and is never held across I/O; a context's run_mu is
 * held while one call uses its kernel. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cleanup.h"
#include "gateway/code/internal.h"

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static code_ctx_t *reg_head;

static int64_t
wall_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the registry ---------------------------------------------------------- */

void
code_ctx_unref (code_ctx_t *c, sbx_runtime_t *rt)
{
  pthread_mutex_lock (&reg_mu);
  bool last = --c->refs == 0;
  pthread_mutex_unlock (&reg_mu);
  if (!last)
    return;
  code_kernel_close (rt, c);
  code_strv_free (c->env);
  pthread_mutex_destroy (&c->run_mu);
  free (c);
}

/* Unlinks c (reg_mu held); the registry's reference is the caller's. */
static void
unlink_locked (code_ctx_t *c)
{
  for (code_ctx_t **pp = &reg_head; *pp != NULL; pp = &(*pp)->next)
    if (*pp == c)
      {
        *pp = c->next;
        c->removed = true;
        atomic_store (&c->closing, true);
        return;
      }
}

/* Unlinks *pp, whose sandbox has ended, from the registry (reg_mu held),
 * marks it removed, closing and its sandbox ended, and pushes it on *dead
 * to be released after the lock. */
static void
take_locked (code_ctx_t **pp, code_ctx_t **dead)
{
  code_ctx_t *c = *pp;
  *pp = c->next;
  c->removed = true;
  atomic_store (&c->closing, true);
  atomic_store (&c->sandbox_ended, true);
  c->next = *dead;
  *dead = c;
}

/* Drops contexts of an earlier sandbox of the same id (reg_mu held);
 * returns them in a list to release. */
static code_ctx_t *
stale_locked (const char *sid, int64_t created)
{
  code_ctx_t *dead = NULL;
  for (code_ctx_t **pp = &reg_head; *pp != NULL;)
    {
      code_ctx_t *c = *pp;
      if (strcmp (c->sid, sid) == 0 && c->sbx_created_ms != created)
        take_locked (pp, &dead);
      else
        pp = &c->next;
    }
  return dead;
}

static void
release_list (code_ctx_t *dead, sbx_runtime_t *rt)
{
  while (dead != NULL)
    {
      code_ctx_t *n = dead->next;
      code_ctx_unref (dead, rt);
      dead = n;
    }
}

/* The sandbox (renewing its idle timer), stale contexts dropped. */
static int
sandbox_checked (sbx_runtime_t *rt, const char *sid, int64_t *created, err_t *err)
{
  sbx_info_t info;
  if (sbx_get (rt, sid, &info, err) < 0)
    return -1;
  if (info.dead)
    return err_make (err, EBUSY, "sandbox `%s` is dead: %s", sid, info.dead_reason);
  pthread_mutex_lock (&reg_mu);
  code_ctx_t *dead = stale_locked (sid, info.created_ms);
  pthread_mutex_unlock (&reg_mu);
  release_list (dead, rt);
  *created = info.created_ms;
  return 0;
}

size_t
code_count (const char *sid, int64_t created_ms)
{
  size_t n = 0;
  pthread_mutex_lock (&reg_mu);
  for (code_ctx_t *c = reg_head; c != NULL; c = c->next)
    n += strcmp (c->sid, sid) == 0 && c->sbx_created_ms == created_ms;
  pthread_mutex_unlock (&reg_mu);
  return n;
}

/* Holds context `cid` (or the default of `lang` when cid is empty: NULL
 * with no error when there is none). */
static code_ctx_t *
ctx_find (const char *sid, const char *cid, const char *lang)
{
  pthread_mutex_lock (&reg_mu);
  code_ctx_t *c = reg_head;
  for (; c != NULL; c = c->next)
    if (strcmp (c->sid, sid) == 0
        && (cid[0] ? strcmp (c->info.id, cid) == 0 : c->info.is_default && strcmp (c->info.language, lang) == 0))
      break;
  if (c != NULL)
    c->refs++;
  pthread_mutex_unlock (&reg_mu);
  return c;
}

/* Makes and registers a context (its kernel not started), held. */
static int
ctx_new (sbx_runtime_t *rt, const char *sid, int64_t created, const char *lang, const char *cwd, char *const *env,
         bool is_default, code_ctx_t **out, err_t *err)
{
  if (!code_name_valid (lang, CODE_LANGUAGE_MAX))
    return err_make (err, EINVAL, "invalid language `%s`", lang);
  if (cwd != NULL && cwd[0] != '\0' && (cwd[0] != '/' || strlen (cwd) > CODE_CWD_MAX))
    return err_make (err, EINVAL, "cwd must be an absolute path of at most %d bytes", CODE_CWD_MAX);
  code_ctx_t *c = calloc (1, sizeof *c);
  if (c == NULL || code_env_merge (env, NULL, &c->env, err) < 0)
    {
      free (c);
      return err_make (err, ENOMEM, "CreateContext: out of memory");
    }
  pthread_mutex_init (&c->run_mu, NULL);
  snprintf (c->sid, sizeof c->sid, "%s", sid);
  c->sbx_created_ms = created;
  char uuid[37];
  jmsg_uuid (uuid);
  snprintf (c->info.id, sizeof c->info.id, "ctx-%.8s%.4s", uuid, uuid + 9);
  snprintf (c->info.language, sizeof c->info.language, "%s", lang);
  snprintf (c->info.cwd, sizeof c->info.cwd, "%s", cwd != NULL && cwd[0] ? cwd : "/root");
  c->info.created_ms = wall_ms ();
  c->info.is_default = is_default;
  c->refs = 2; /* the registry's and the caller's */
  size_t max = (size_t) sbx_runtime_config (rt)->max_contexts;
  size_t max_total = (size_t) sbx_runtime_config (rt)->max_contexts_total;
  pthread_mutex_lock (&reg_mu);
  size_t n = 0, total = 0;
  bool taken = false;
  for (code_ctx_t *o = reg_head; o != NULL; o = o->next, total++)
    if (strcmp (o->sid, sid) == 0)
      {
        n++;
        taken |= is_default && o->info.is_default && strcmp (o->info.language, lang) == 0;
      }
  bool full = total >= max_total;
  if (n < max && !taken && !full)
    {
      c->next = reg_head;
      reg_head = c;
    }
  pthread_mutex_unlock (&reg_mu);
  if (n >= max || taken || full)
    {
      code_strv_free (c->env);
      pthread_mutex_destroy (&c->run_mu);
      free (c);
      if (taken)
        return err_make (err, EAGAIN, "sandbox `%s`: its default `%s` context is being made; retry", sid, lang);
      if (n >= max)
        return err_make (err, EAGAIN, "sandbox `%s` has %zu code contexts (SANDBOX_MAX_CONTEXTS)", sid, n);
      return err_make (err, EAGAIN, "the gateway has %zu code contexts (SANDBOX_MAX_CONTEXTS_TOTAL); delete some",
                       total);
    }
  *out = c;
  return 0;
}

/* Unregisters c and releases the registry's reference. */
static void
ctx_remove (sbx_runtime_t *rt, code_ctx_t *c)
{
  pthread_mutex_lock (&reg_mu);
  bool was = !c->removed;
  unlink_locked (c);
  pthread_mutex_unlock (&reg_mu);
  if (was)
    code_ctx_unref (c, rt);
}

static int
create_started (sbx_runtime_t *rt, const char *sid, const char *lang, const char *cwd, char *const *env,
                bool is_default, const code_cancel_t *cancel, code_ctx_t **out, err_t *err)
{
  int64_t created;
  if (sandbox_checked (rt, sid, &created, err) < 0)
    return -1;
  code_ctx_t *c = NULL;
  if (ctx_new (rt, sid, created, lang, cwd, env, is_default, &c, err) < 0)
    return -1;
  pthread_mutex_lock (&c->run_mu);
  int rc = code_kernel_start (rt, c, cancel, err);
  pthread_mutex_unlock (&c->run_mu);
  if (rc < 0)
    {
      ctx_remove (rt, c);
      code_ctx_unref (c, rt);
      return -1;
    }
  *out = c;
  return 0;
}

int
code_create (sbx_runtime_t *rt, const char *sid, const char *language, const char *cwd, char *const *env,
             const code_cancel_t *cancel, code_info_t *out, err_t *err)
{
  code_ctx_t *c = NULL;
  if (create_started (rt, sid, language && language[0] ? language : "python3", cwd, env, false, cancel, &c, err) < 0)
    return -1;
  *out = c->info;
  code_ctx_unref (c, rt);
  return 0;
}

int
code_list (sbx_runtime_t *rt, const char *sid, code_info_t **out, size_t *n, char ***languages, size_t *n_lang,
           err_t *err)
{
  int64_t created;
  if (sandbox_checked (rt, sid, &created, err) < 0)
    return -1;
  pthread_mutex_lock (&reg_mu);
  size_t k = 0, cap = 0;
  for (code_ctx_t *c = reg_head; c != NULL; c = c->next)
    cap += strcmp (c->sid, sid) == 0;
  code_info_t *v = calloc (cap + 1, sizeof *v);
  for (code_ctx_t *c = reg_head; c != NULL && v != NULL; c = c->next)
    if (strcmp (c->sid, sid) == 0)
      v[k++] = c->info;
  pthread_mutex_unlock (&reg_mu);
  if (v == NULL)
    return err_make (err, ENOMEM, "ListContexts: out of memory");
  if (code_list_languages (rt, sid, languages, n_lang, err) < 0)
    {
      free (v);
      return -1;
    }
  *out = v;
  *n = k;
  return 0;
}

static int
ctx_get (sbx_runtime_t *rt, const char *sid, const char *cid, code_ctx_t **out, err_t *err)
{
  int64_t created;
  if (sandbox_checked (rt, sid, &created, err) < 0)
    return -1;
  *out = ctx_find (sid, cid, "");
  if (*out == NULL)
    return err_make (err, ENOENT, "sandbox `%s` has no code context `%s`", sid, cid);
  return 0;
}

int
code_restart (sbx_runtime_t *rt, const char *sid, const char *cid, const code_cancel_t *cancel, code_info_t *out,
              err_t *err)
{
  code_ctx_t *c = NULL;
  if (ctx_get (rt, sid, cid, &c, err) < 0)
    return -1;
  pthread_mutex_lock (&c->run_mu);
  code_kernel_close (rt, c);
  int rc = code_kernel_start (rt, c, cancel, err);
  pthread_mutex_unlock (&c->run_mu);
  *out = c->info;
  code_ctx_unref (c, rt);
  return rc;
}

int
code_delete (sbx_runtime_t *rt, const char *sid, const char *cid, err_t *err)
{
  code_ctx_t *c = NULL;
  if (ctx_get (rt, sid, cid, &c, err) < 0)
    return -1;
  ctx_remove (rt, c);
  /* A cell running sees `closing` within CODE_POLL_MS; the kernel goes
   * with the last reference. */
  pthread_mutex_lock (&c->run_mu);
  code_kernel_close (rt, c);
  pthread_mutex_unlock (&c->run_mu);
  code_ctx_unref (c, rt);
  return 0;
}

/* The runtime's end hook: sandbox `sid` created at `created` has ended
 * (deleted, expired or dead), so its contexts go. A running cell holds
 * its context and sees `closing` within CODE_POLL_MS; the kernel is
 * closed with the last reference (here when none runs). */
static void
sandbox_ended (void *ctx, sbx_runtime_t *rt, const char *sid, int64_t created)
{
  (void) ctx;
  code_ctx_t *dead = NULL;
  pthread_mutex_lock (&reg_mu);
  for (code_ctx_t **pp = &reg_head; *pp != NULL;)
    {
      code_ctx_t *c = *pp;
      if (strcmp (c->sid, sid) == 0 && c->sbx_created_ms == created)
        take_locked (pp, &dead);
      else
        pp = &c->next;
    }
  pthread_mutex_unlock (&reg_mu);
  release_list (dead, rt);
}

void
code_attach (sbx_runtime_t *rt)
{
  sbx_set_end_hook (rt, sandbox_ended, NULL);
}

int
code_ctx_for_run (sbx_runtime_t *rt, const char *sid, const char *cid, const char *lang, const code_cancel_t *cancel,
                  code_ctx_t **out, err_t *err)
{
  if (cid != NULL && cid[0] != '\0')
    return ctx_get (rt, sid, cid, out, err);
  int64_t created;
  if (sandbox_checked (rt, sid, &created, err) < 0)
    return -1;
  *out = ctx_find (sid, "", lang);
  if (*out != NULL)
    return 0;
  return create_started (rt, sid, lang, NULL, NULL, true, cancel, out, err);
}
