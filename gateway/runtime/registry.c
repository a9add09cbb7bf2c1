/* runtime/registry: sandbox ids, the registry of live sandboxes, references
 * held by execs and layer users, and get/list/delete (see runtime.h and
 * internal.h for the locking rules). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

sbx_t *
sbx_find_locked (sbx_runtime_t *rt, const char *id)
{
  for (sbx_t *s = rt->list; s != NULL; s = s->next)
    if (strcmp (s->id, id) == 0)
      return s;
  return NULL;
}

void
sbx_unlink_locked (sbx_runtime_t *rt, sbx_t *s)
{
  for (sbx_t **p = &rt->list; *p != NULL; p = &(*p)->next)
    if (*p == s)
      {
        *p = s->next;
        rt->count--;
        return;
      }
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
sbx_release (sbx_runtime_t *rt, sbx_t *s)
{
  pthread_mutex_lock (&rt->mu);
  s->refs--;
  s->last_used_ms = sbx_mono_ms ();
  pthread_cond_broadcast (&rt->cv);
  pthread_mutex_unlock (&rt->mu);
}

void
sbx_fill_info_locked (sbx_runtime_t *rt, const sbx_t *s, sbx_info_t *out)
{
  memset (out, 0, sizeof *out);
  snprintf (out->id, sizeof out->id, "%s", s->id);
  /* Clients see wall-clock times; the idle timer runs on the monotonic
   * clock, so a wall-clock step neither expires nor revives a sandbox. */
  out->created_ms = s->created_ms;
  out->last_used_ms = s->created_ms + (s->last_used_ms - s->created_mono_ms);
  out->allow_egress = s->allow_egress;
  long n = sbx_cg_count (&rt->cg, s->id, NULL);
  out->process_count = n > 0 ? n : 0;
  char disk[PATH_MAX + SBX_ID_MAX + 16];
  snprintf (disk, sizeof disk, "%s/disk", s->state);
  struct statfs sf;
  if (statfs (disk, &sf) == 0)
    {
      out->disk_limit_bytes = (uint64_t) sf.f_blocks * (uint64_t) sf.f_bsize;
      out->disk_used_bytes = (uint64_t) (sf.f_blocks - sf.f_bfree) * (uint64_t) sf.f_bsize;
    }
}

void
sbx_teardown (sbx_runtime_t *rt, const char *id, const char *state, int pidfd)
{
  err_t err = ERR_INIT;
  if (pidfd >= 0)
    {
      syscall (SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
      /* The gateway is the holders' subreaper: reap this one now, so its
       * group empties at once (ECHILD if another process adopted it). */
      siginfo_t si;
      while (waitid ((idtype_t) P_PIDFD, (id_t) pidfd, &si, WEXITED) < 0 && errno == EINTR)
        ;
      close (pidfd);
    }
  if (sbx_cg_kill (&rt->cg, id, NULL, &err) < 0)
    err_warn_release (&err, "delete `%s`", id);
  char disk[PATH_MAX + SBX_ID_MAX + 16];
  snprintf (disk, sizeof disk, "%s/disk", state);
  if (umount2 (disk, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
    log_msg (SEV_WARNING, "delete `%s`: unmount `%s`: %s", id, disk, strerror (errno));
  sbx_remove_tree (state);
  if (sbx_cg_remove (&rt->cg, id, NULL, &err) < 0)
    err_warn_release (&err, "delete `%s`", id);
}

int
sbx_with_layer (sbx_runtime_t *rt, const char *id, bool freeze, sbx_layer_fn fn, void *ctx, err_t *err)
{
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id");
  sbx_t *s = sbx_acquire (rt, id);
  if (s == NULL)
    return err_make (err, ENOENT, "sandbox `%s` not found", id);
  char upper[sizeof s->state + 16];
  snprintf (upper, sizeof upper, "%s/disk/upper", s->state);
  int rc = 0;
  if (freeze && sbx_cg_freeze (&rt->cg, id, true, err) < 0)
    rc = err_wrap (err, "freeze `%s`", id);
  if (rc == 0)
    rc = fn (upper, ctx, err);
  if (freeze)
    {
      /* Thaw whatever happened, including a consumer that went away. */
      err_t terr = ERR_INIT;
      if (sbx_cg_freeze (&rt->cg, id, false, &terr) < 0)
        err_warn_release (&terr, "thaw `%s`", id);
    }
  sbx_release (rt, s);
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
  err_make (err, ENOENT, "sandbox `%s` not found", id);
  return NULL;
}

int
sbx_delete (sbx_runtime_t *rt, const char *id, err_t *err)
{
  sbx_t *s = lock_ready (rt, id, err);
  if (s == NULL)
    return -1;
  s->deleting = true;
  int pidfd = take_fd (&s->holder_pidfd);
  pid_t slirp = s->slirp;
  int slirp_exit_fd = take_fd (&s->slirp_exit_fd);
  s->slirp = 0;
  char state[sizeof s->state];
  snprintf (state, sizeof state, "%s", s->state);
  pthread_mutex_unlock (&rt->mu);

  /* Kill first: execs in flight see their command die and let go. */
  sbx_net_stop (slirp, slirp_exit_fd);
  sbx_teardown (rt, id, state, pidfd);

  pthread_mutex_lock (&rt->mu);
  while (s->refs > 0)
    pthread_cond_wait (&rt->cv, &rt->mu);
  sbx_unlink_locked (rt, s);
  pthread_cond_broadcast (&rt->cv);
  pthread_mutex_unlock (&rt->mu);
  if (s->ctl_fd >= 0)
    close (s->ctl_fd);
  free (s);
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
  sbx_fill_info_locked (rt, s, out);
  pthread_mutex_unlock (&rt->mu);
  return 0;
}

static int
info_cmp (const void *a, const void *b)
{
  return strcmp (((const sbx_info_t *) a)->id, ((const sbx_info_t *) b)->id);
}

int
sbx_list (sbx_runtime_t *rt, sbx_info_t **out, size_t *n, err_t *err)
{
  pthread_mutex_lock (&rt->mu);
  sbx_info_t *v = calloc (rt->count + 1, sizeof *v);
  if (v == NULL)
    {
      pthread_mutex_unlock (&rt->mu);
      return err_make (err, ENOMEM, "list: out of memory");
    }
  size_t k = 0;
  for (sbx_t *s = rt->list; s != NULL; s = s->next)
    if (s->ready && !s->deleting)
      sbx_fill_info_locked (rt, s, &v[k++]);
  pthread_mutex_unlock (&rt->mu);
  qsort (v, k, sizeof *v, info_cmp);
  *out = v;
  *n = k;
  return 0;
}
