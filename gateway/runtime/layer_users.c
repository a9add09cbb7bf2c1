/* runtime/layer_users: a sandbox's writable layer lent to a reader (an
 * export, a persist's commit) through sbx_with_layer — the sandbox
 * referenced, its upper directory opened, optionally frozen for the read
 * (shared by concurrent readers, thawed by the last) — and the users'
 * cancellation: when the sandbox is deleted, and when a freeze outlasts
 * SANDBOX_EXPORT_FREEZE_SECONDS (the idler calls
 * sbx_enforce_freeze_deadlines). It does not read the layer itself: the
 * caller's function does.
 *
 * Threading: the list of users lives under rt->mu, a sandbox's freeze
 * count under its freeze_mu; a user lives on its caller's stack while it
 * is linked. A cancel only marks a call cancelled, so it may run under
 * rt->mu. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"

void
sbx_cancel_layer_users_locked (sbx_t *s, int status, const char *why)
{
  for (sbx_layer_user_t *u = s->layer_users; u != NULL; u = u->next)
    if (!u->cancelled && u->cancel != NULL)
      {
        u->cancelled = true;
        u->cancel (u->ctx, status, why);
      }
}

/* Exports cancelled per pass whose warning is logged (the lock is not held
 * across the log's write; any beyond are cancelled all the same and
 * counted in one line). */
#define FREEZE_LOGGED_PER_PASS 16

void
sbx_enforce_freeze_deadlines (sbx_runtime_t *rt)
{
  int64_t now = sbx_mono_ms ();
  char ids[FREEZE_LOGGED_PER_PASS][SBX_ID_MAX + 1];
  size_t n = 0, unlogged = 0;
  pthread_mutex_lock (&rt->mu);
  for (sbx_t *s = rt->layer_users > 0 ? rt->list : NULL; s != NULL; s = s->next)
    for (sbx_layer_user_t *u = s->layer_users; u != NULL; u = u->next)
      if (!u->cancelled && u->freeze_deadline_ms > 0 && now >= u->freeze_deadline_ms && u->cancel != NULL)
        {
          u->cancelled = true;
          if (n < FREEZE_LOGGED_PER_PASS)
            snprintf (ids[n++], sizeof ids[0], "%s", s->id);
          else
            unlogged++;
          /* The cancel does not block (it marks the call cancelled): the
           * user it reaches lives on its caller's stack until it unlinks
           * itself under this lock. */
          u->cancel (u->ctx, ETIMEDOUT,
                     "the export kept the sandbox frozen too long (SANDBOX_EXPORT_FREEZE_SECONDS)");
        }
  pthread_mutex_unlock (&rt->mu);
  for (size_t i = 0; i < n; i++)
    log_fields (SEV_WARNING,
                json_pack ("{s:s, s:i}", "sandbox_id", ids[i], "seconds", (int) rt->cfg.freeze_max_seconds),
                "an export kept the sandbox frozen too long: cancelled");
  if (unlogged > 0)
    log_fields (SEV_WARNING, json_pack ("{s:i}", "more", (int) unlogged),
                "more exports kept their sandboxes frozen too long: cancelled");
}

/* Takes (or shares) the sandbox's freeze. */
static int
freeze_hold (sbx_runtime_t *rt, sbx_t *s, err_t *err)
{
  pthread_mutex_lock (&s->freeze_mu);
  int rc = 0;
  if (s->freezers == 0 && sbx_cg_freeze (&rt->cg, s->id, true, err) < 0)
    {
      rc = err_wrap (err, "freeze `%s`", s->id);
      cleanup_err err_t terr = ERR_INIT;
      sbx_cg_freeze (&rt->cg, s->id, false, &terr); /* a half-made freeze */
    }
  if (rc == 0)
    s->freezers++;
  pthread_mutex_unlock (&s->freeze_mu);
  return rc;
}

/* Lets go of the freeze; the last user thaws the sandbox. */
static void
freeze_release (sbx_runtime_t *rt, sbx_t *s)
{
  pthread_mutex_lock (&s->freeze_mu);
  if (--s->freezers == 0)
    {
      cleanup_err err_t terr = ERR_INIT;
      if (sbx_cg_freeze (&rt->cg, s->id, false, &terr) < 0 && !s->deleting)
        err_warn_release (&terr, "thaw `%s`", s->id);
    }
  pthread_mutex_unlock (&s->freeze_mu);
}

static void
unlink_user_locked (sbx_t *s, sbx_layer_user_t *u)
{
  for (sbx_layer_user_t **p = &s->layer_users; *p != NULL; p = &(*p)->next)
    if (*p == u)
      {
        *p = u->next;
        return;
      }
}

int
sbx_with_layer (sbx_runtime_t *rt, const char *id, bool freeze, sbx_layer_fn fn, void *ctx, sbx_cancel_fn cancel,
                void *cancel_ctx, err_t *err)
{
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  sbx_t *s = sbx_acquire (rt, id);
  if (s == NULL)
    return sbx_err_not_found (err, id, NULL);
  sbx_layer_user_t user = {.cancel = cancel, .ctx = cancel_ctx};
  pthread_mutex_lock (&rt->mu);
  user.next = s->layer_users;
  s->layer_users = &user;
  rt->layer_users++;
  pthread_mutex_unlock (&rt->mu);
  cleanup_close int upper = openat (s->disk_fd, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  sbx_layer_t layer = {.upper_fd = upper};
  if (s->uid_slot >= 0)
    {
      layer.uid_base = sbx_uid_base (rt, s->uid_slot);
      layer.uid_range = (uint32_t) rt->cfg.uid_range;
      layer.userxattr = true;
    }
  int rc = upper < 0 ? err_make_sys (err, errno, "open the layer of `%s`", id) : 0;
  if (rc == 0 && freeze)
    rc = freeze_hold (rt, s, err);
  if (rc == 0 && freeze)
    {
      pthread_mutex_lock (&rt->mu);
      user.freeze_deadline_ms = sbx_mono_ms () + rt->cfg.freeze_max_seconds * 1000;
      pthread_mutex_unlock (&rt->mu);
    }
  if (rc == 0)
    {
      rc = fn (&layer, ctx, err);
      if (freeze)
        freeze_release (rt, s); /* whatever happened, including a consumer that went away */
    }
  pthread_mutex_lock (&rt->mu);
  unlink_user_locked (s, &user);
  rt->layer_users--;
  bool deleted = s->deleting;
  pthread_mutex_unlock (&rt->mu);
  sbx_release (rt, s);
  if (rc < 0 && deleted)
    err->status = ENOENT; /* what it was reading is gone */
  return rc;
}
