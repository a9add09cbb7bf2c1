/* runtime/registry: sandbox ids, the registry of live sandboxes, references
 * held by execs and layer users, get/list/delete, and the end hook that
 * tells other layers of every sandbox that ends (see runtime.h and
 * internal.h for the locking rules). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

int64_t
sbx_wall_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t
sbx_mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool
sbx_id_valid (const char *id)
{
  size_t n = strlen (id);
  if (n == 0 || n > SBX_ID_MAX)
    return false;
  for (size_t i = 0; i < n; i++)
    {
      char c = id[i];
      bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (!alnum && (i == 0 || (c != '_' && c != '-')))
        return false;
    }
  return true;
}

int
sbx_err_not_found (err_t *err, const char *id, const char *more)
{
  return err_make_reason (err, ENOENT, ERR_REASON_SANDBOX_NOT_FOUND, "sandbox `%s` not found%s", id,
                          more != NULL ? more : "");
}

size_t
sbx_count (sbx_runtime_t *rt)
{
  pthread_mutex_lock (&rt->mu);
  size_t n = rt->count;
  pthread_mutex_unlock (&rt->mu);
  return n;
}

const sbx_config_t *
sbx_runtime_config (const sbx_runtime_t *rt)
{
  return &rt->cfg;
}

int
sbx_runtime_check (sbx_runtime_t *rt, err_t *err)
{
  struct stat st;
  if (stat (rt->cfg.rootfs, &st) < 0 || !S_ISDIR (st.st_mode))
    return err_make (err, ENOENT, "the image `%s` (SANDBOX_ROOTFS) is gone", rt->cfg.rootfs);
  if (access (rt->cfg.state_dir, W_OK | X_OK) < 0)
    return err_make_sys (err, errno, "the state directory `%s` (SANDBOX_STATE_DIR) takes no files",
                         rt->cfg.state_dir);
  /* The hierarchies this instance's groups live in (the groups themselves
   * are made with the first sandbox). */
  for (size_t i = 0; i < rt->cg.n; i++)
    {
      char parent[sizeof rt->cg.roots[i]];
      snprintf (parent, sizeof parent, "%s", rt->cg.roots[i]);
      char *slash = strrchr (parent, '/');
      if (slash != NULL && slash != parent)
        *slash = '\0';
      if (stat (parent, &st) < 0 || !S_ISDIR (st.st_mode))
        return err_make (err, ENOENT, "the cgroup hierarchy `%s` is gone", parent);
    }
  return 0;
}

/* FNV-1a: ids are short and chosen by callers, who cannot make a bucket
 * longer than the sandboxes they may launch. */
static size_t
id_hash (const char *id)
{
  uint64_t h = 14695981039346656037ULL;
  for (const unsigned char *p = (const unsigned char *) id; *p != '\0'; p++)
    h = (h ^ *p) * 1099511628211ULL;
  return (size_t) (h ^ (h >> 32));
}

int
sbx_index_init (sbx_runtime_t *rt, err_t *err)
{
  size_t n = 64;
  while (n < (size_t) rt->cfg.max_sandboxes && n < ((size_t) 1 << 20))
    n <<= 1;
  rt->index = calloc (n, sizeof *rt->index);
  if (rt->index == NULL)
    return err_make (err, ENOMEM, "runtime: out of memory");
  rt->index_mask = n - 1;
  return 0;
}

sbx_t *
sbx_find_locked (sbx_runtime_t *rt, const char *id)
{
  for (sbx_t *s = rt->index[id_hash (id) & rt->index_mask]; s != NULL; s = s->hnext)
    if (strcmp (s->id, id) == 0)
      return s;
  return NULL;
}

void
sbx_link_locked (sbx_runtime_t *rt, sbx_t *s)
{
  s->next = rt->list;
  if (s->next != NULL)
    s->next->pprev = &s->next;
  s->pprev = &rt->list;
  rt->list = s;
  sbx_t **bucket = &rt->index[id_hash (s->id) & rt->index_mask];
  s->hnext = *bucket;
  *bucket = s;
  rt->count++;
}

void
sbx_unlink_locked (sbx_runtime_t *rt, sbx_t *s)
{
  if (s->pprev == NULL)
    return;
  *s->pprev = s->next;
  if (s->next != NULL)
    s->next->pprev = s->pprev;
  s->pprev = NULL;
  for (sbx_t **p = &rt->index[id_hash (s->id) & rt->index_mask]; *p != NULL; p = &(*p)->hnext)
    if (*p == s)
      {
        *p = s->hnext;
        break;
      }
  rt->count--;
  /* Its processes are gone: the range may serve a later sandbox. */
  sbx_uid_release_locked (rt, s->uid_slot);
  s->uid_slot = -1;
}

sbx_t *
sbx_acquire (sbx_runtime_t *rt, const char *id)
{
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = sbx_find_locked (rt, id);
  if (s != NULL && s->ready && !s->deleting)
    {
      s->refs++;
      s->last_used_ms = sbx_mono_ms ();
    }
  else
    s = NULL;
  pthread_mutex_unlock (&rt->mu);
  return s;
}

void
sbx_free_record (sbx_t *s)
{
  if (s->disk_fd >= 0)
    close (s->disk_fd);
  if (s->port_spare >= 0)
    close (s->port_spare);
  pthread_mutex_destroy (&s->freeze_mu);
  free (s->env);
  free (s->labels);
  free (s);
}

bool
sbx_unref_locked (sbx_runtime_t *rt, sbx_t *s)
{
  s->refs--;
  pthread_cond_broadcast (&rt->cv);
  return s->orphaned && s->refs == 0;
}

void
sbx_release (sbx_runtime_t *rt, sbx_t *s)
{
  pthread_mutex_lock (&rt->mu);
  s->last_used_ms = sbx_mono_ms ();
  bool last = sbx_unref_locked (rt, s);
  pthread_mutex_unlock (&rt->mu);
  if (last)
    sbx_free_record (s);
}

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

void
sbx_teardown (sbx_runtime_t *rt, const char *id, const char *state, pid_t holder)
{
  err_t err = ERR_INIT;
  if (holder > 0)
    {
      /* The holder is the gateway's child (the gateway is the subreaper of
       * what its helpers leave), reaped here and nowhere else: its pid
       * cannot have been reused. Reaped now, so its group empties at once. */
      kill (holder, SIGKILL);
      while (waitpid (holder, NULL, 0) < 0 && errno == EINTR)
        ;
    }
  if (sbx_cg_kill (&rt->cg, id, NULL, &err) < 0)
    err_warn_release (&err, "delete `%s`", id);
  /* The sandbox's mounts were in its own mount namespace, gone with its
   * processes; the disk goes when the last descriptor of it closes. */
  sbx_remove_tree (state);
  if (sbx_remove_groups (rt, id, &err) < 0)
    err_warn_release (&err, "delete `%s`", id);
}

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

/* Locks the registry and finds the ready sandbox `id`: on NULL (*err
 * EINVAL or ENOENT) the registry is not locked. */
static sbx_t *
lock_ready (sbx_runtime_t *rt, const char *id, err_t *err)
{
  if (!sbx_id_valid (id))
    {
      err_make (err, EINVAL, "invalid sandbox id");
      return NULL;
    }
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = sbx_find_locked (rt, id);
  if (s != NULL && s->ready && !s->deleting)
    return s;
  pthread_mutex_unlock (&rt->mu);
  sbx_err_not_found (err, id, NULL);
  return NULL;
}

void
sbx_set_end_hook (sbx_runtime_t *rt, sbx_end_fn fn, void *ctx)
{
  pthread_mutex_lock (&rt->mu);
  rt->ended = fn;
  rt->ended_ctx = ctx;
  pthread_mutex_unlock (&rt->mu);
}

void
sbx_tell_ended (sbx_runtime_t *rt, const char *id, int64_t created_ms)
{
  pthread_mutex_lock (&rt->mu);
  sbx_end_fn fn = rt->ended;
  void *ctx = rt->ended_ctx;
  pthread_mutex_unlock (&rt->mu);
  if (fn != NULL)
    fn (ctx, rt, id, created_ms);
}

int
sbx_delete (sbx_runtime_t *rt, const char *id, err_t *err)
{
  sbx_t *s = lock_ready (rt, id, err);
  if (s == NULL)
    return -1;
  s->deleting = true;
  /* Exports in flight stop now rather than hold the delete up, and the
   * sandbox thaws: frozen tasks do not die (cgroup v1). */
  sbx_cancel_layer_users_locked (s, ENOENT, "the sandbox was deleted");
  pid_t holder = s->holder;
  int64_t created_ms = s->created_ms;
  pid_t slirp = s->slirp;
  int slirp_exit_fd = take_fd (&s->slirp_exit_fd);
  s->slirp = 0;
  char state[sizeof s->state];
  snprintf (state, sizeof state, "%s", s->state);
  pthread_mutex_unlock (&rt->mu);

  pthread_mutex_lock (&s->freeze_mu);
  cleanup_err err_t terr = ERR_INIT;
  if (s->freezers > 0)
    sbx_cg_freeze (&rt->cg, id, false, &terr);
  pthread_mutex_unlock (&s->freeze_mu);

  /* Kill first: execs in flight see their command die and let go; the
   * sandbox's detached processes are forgotten with it. */
  sbx_proc_forget_sandbox (rt, id);
  sbx_net_stop (slirp, slirp_exit_fd);
  sbx_egress_release (rt, id);
  sbx_teardown (rt, id, state, holder);
  /* What other layers keep beside it goes now, whatever ended it. */
  sbx_tell_ended (rt, id, created_ms);

  /* Its calls saw their commands die and let go, but one may be held by
   * its client (an exec whose last output is not read): the delete waits
   * for them SBX_DELETE_WAIT_MS at most, then the record leaves the
   * registry all the same and the last of them frees it. */
  pthread_mutex_lock (&rt->mu);
  int64_t until = sbx_mono_ms () + SBX_DELETE_WAIT_MS;
  while (s->refs > 0 && sbx_mono_ms () < until)
    {
      struct timespec ts = {.tv_sec = until / 1000, .tv_nsec = (long) (until % 1000) * 1000000};
      pthread_cond_timedwait (&rt->cv, &rt->mu, &ts);
    }
  sbx_unlink_locked (rt, s);
  bool last = s->refs == 0;
  s->orphaned = !last;
  pthread_cond_broadcast (&rt->cv);
  pthread_mutex_unlock (&rt->mu);
  if (last)
    sbx_free_record (s);
  log_fields (SEV_INFO, json_pack ("{s:s}", "sandbox_id", id), "sandbox deleted");
  return 0;
}

int
sbx_get (sbx_runtime_t *rt, const char *id, sbx_info_t *out, err_t *err)
{
  sbx_t *s = lock_ready (rt, id, err);
  if (s == NULL)
    return -1;
  s->last_used_ms = sbx_mono_ms ();
  sbx_info_copy_locked (s, out);
  pthread_mutex_unlock (&rt->mu);
  sbx_info_measure (rt, s, out);
  return 0;
}

void
sbx_set_store_gen (sbx_runtime_t *rt, const char *id, const char *gen)
{
  pthread_mutex_lock (&rt->mu);
  sbx_t *s = sbx_find_locked (rt, id);
  if (s != NULL)
    snprintf (s->store_gen, sizeof s->store_gen, "%s", gen);
  pthread_mutex_unlock (&rt->mu);
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
