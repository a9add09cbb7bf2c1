/* runtime/registry: sandbox ids, the registry of live sandboxes, references
 * held by execs and layer users, get/delete, and the end hook that tells
 * other layers of every sandbox that ends (see runtime.h and internal.h
 * for the locking rules). What a record tells a client and List are
 * registry_info.c's; lending a sandbox's layer is layer_users.c's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/mount.h>
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
