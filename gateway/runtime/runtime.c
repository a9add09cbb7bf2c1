/* runtime/runtime: creating, stopping and destroying the runtime (see
 * runtime.h). The rest of the runtime is in the files internal.h lists. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/path.h"

static void
runtime_free (sbx_runtime_t *rt)
{
  for (size_t i = 0; rt->host_addrs != NULL && rt->host_addrs[i] != NULL; i++)
    free (rt->host_addrs[i]);
  free (rt->host_addrs);
  free (rt->uid_free);
  sbx_uid_block_release (rt);
  free (rt->index);
  if (rt->base_ns_fd >= 0)
    close (rt->base_ns_fd);
  if (rt->filter_fd >= 0)
    close (rt->filter_fd);
  for (size_t i = 0; i < rt->n_volume_fds; i++)
    close (rt->volume_fds[i]);
  for (int i = 0; i < 2; i++)
    if (rt->egress_progs[i] >= 0)
      close (rt->egress_progs[i]);
  pthread_mutex_destroy (&rt->mu);
  pthread_cond_destroy (&rt->cv);
  pthread_mutex_destroy (&rt->proc_mu);
  pthread_cond_destroy (&rt->proc_cv);
  free (rt);
}

/* How long a start-up helper that makes something for every launch may
 * take. */
#define MAKE_TIMEOUT_MS 30000

/* Runs a start-up helper that answers READY with one descriptor, which
 * goes to *out; `what` names it in the error. */
static int
make_by_helper (sbx_runtime_t *rt, const char *const *argv, const char *what, int *out, err_t *err)
{
  sbx_report_t r;
  int fd = -1, got = 0;
  if (sbx_run_helper_once (rt, argv, false, MAKE_TIMEOUT_MS, &r, &fd, &got, err) < 0)
    return -1;
  if (got == 1 && r.type == SBX_REPORT_READY && fd >= 0)
    {
      *out = fd;
      return 0;
    }
  if (fd >= 0)
    close (fd);
  return err_make (err, got == 1 && r.status != 0 ? r.status : EIO, "make %s: %s", what,
                   got == 1 && r.type == SBX_REPORT_ERROR ? r.text : "the helper did not answer");
}

/* The base mount namespace, made by `sandbox-helper base` (helper/rootfs.c)
 * and kept by descriptor in rt->base_ns_fd; then the sandboxes' seccomp
 * filter, compiled once by `sandbox-helper filter` (helper/confine.c) and
 * kept in rt->filter_fd. Every launch's helper gets both. */
static int
make_launch_fds (sbx_runtime_t *rt, err_t *err)
{
  const char *base[] = {"sandbox-helper", "base", "--id", "base", "--state", rt->sandboxes_dir, NULL};
  /* A writable volume is a host directory: no set-id file may be made. */
  bool rw_volume = false;
  for (size_t i = 0; rt->cfg.volumes != NULL && rt->cfg.volumes[i] != NULL; i++)
    {
      const char *opts = strchr (strchr (rt->cfg.volumes[i], ':') + 1, ':');
      rw_volume = rw_volume || opts == NULL || strncmp (opts, ":ro", 3) != 0;
    }
  const char *filter[] = {"sandbox-helper", "filter", rw_volume ? "--deny-setid" : NULL, NULL};
  if (make_by_helper (rt, base, "the sandboxes' base mount namespace", &rt->base_ns_fd, err) < 0)
    return -1;
  return make_by_helper (rt, filter, "the sandboxes' seccomp filter", &rt->filter_fd, err);
}

const char *
sbx_volume_host (const char *spec, char *buf, size_t cap)
{
  snprintf (buf, cap, "%s", spec);
  char *colon = strchr (buf, ':');
  if (colon != NULL)
    *colon = '\0';
  return buf;
}

/* Opens each volume's host path once, into rt->volume_fds: the path was
 * resolved by the configuration, so no component may be a symlink now
 * (RESOLVE_NO_SYMLINKS), and what launches clone from then on is this
 * descriptor, whatever becomes of the path. */
static int
open_volumes (sbx_runtime_t *rt, err_t *err)
{
  for (size_t i = 0; rt->cfg.volumes != NULL && rt->cfg.volumes[i] != NULL; i++)
    {
      if (i == SBX_MAX_VOLUMES)
        return err_make (err, E2BIG, "SANDBOX_VOLUME_MOUNTS: more than %d mounts", SBX_MAX_VOLUMES);
      char host[PATH_MAX + 1];
      sbx_volume_host (rt->cfg.volumes[i], host, sizeof host);
      struct open_how how
          = {.flags = O_PATH | O_CLOEXEC | O_NOFOLLOW, .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
      int fd = (int) syscall (SYS_openat2, AT_FDCWD, host, &how, sizeof how);
      if (fd < 0)
        return err_make_sys (err, errno, "SANDBOX_VOLUME_MOUNTS: open `%s` (no symlink may be on its path)", host);
      int at = fcntl (fd, F_DUPFD_CLOEXEC, SBX_VOLUME_FDS_AT);
      close (fd);
      if (at < 0)
        return err_make_sys (err, errno, "SANDBOX_VOLUME_MOUNTS: keep `%s` open", host);
      rt->volume_fds[rt->n_volume_fds++] = at;
    }
  return 0;
}

static int
runtime_init (sbx_runtime_t *rt, const sbx_config_t *cfg, err_t *err)
{
  if (access (cfg->helper, X_OK) < 0)
    return err_make_sys (err, errno, "sandbox helper `%s`", cfg->helper);
  if (sbx_uid_block_claim (rt, err) < 0)
    return -1;
  /* The cpu hierarchy whenever a sandbox may have a CPU limit: the
   * default's, or one its launch asks for (max_cpu_millis 0: any). */
  if (sbx_cg_detect (cfg->cgroup_mount, cfg->cgroup_group, true, &rt->cg, err) < 0)
    return -1;
  if (sbx_path_fmt (rt->sandboxes_dir, sizeof rt->sandboxes_dir, err, "%s/sandboxes", cfg->state_dir) < 0)
    return err_wrap (err, "SANDBOX_STATE_DIR");
  if ((mkdir (cfg->state_dir, 0700) < 0 && errno != EEXIST)
      || (mkdir (rt->sandboxes_dir, 0700) < 0 && errno != EEXIST))
    return err_make_sys (err, errno, "create the state directory `%s`", rt->sandboxes_dir);
  sbx_clean_leftovers (rt);
  if (make_launch_fds (rt, err) < 0 || open_volumes (rt, err) < 0)
    return -1;
  if (sbx_index_init (rt, err) < 0 || sbx_uid_pool_init (rt, err) < 0 || sbx_userns_probe (rt, err) < 0)
    return -1;
  if (!cfg->userns)
    log_msg (SEV_WARNING, "SANDBOX_USERNS is off: sandbox root is host root (uid 0 of the host's user namespace); "
                          "an escape from a sandbox is an escape to host root");
  if (sbx_net_scan_host (rt, err) < 0 || sbx_egress_init (rt, err) < 0)
    return -1;
  int rc = pthread_create (&rt->reaper, NULL, sbx_reaper_main, rt);
  if (rc != 0)
    return err_make_sys (err, rc, "start the reaper");
  rt->reaper_running = true;
  rc = pthread_create (&rt->idler, NULL, sbx_idler_main, rt);
  if (rc != 0)
    return err_make_sys (err, rc, "start the idle reaper");
  rt->idler_running = true;
  if (sbx_cg_spares_possible (&rt->cg))
    {
      /* Without it, launches make their own groups. */
      rt->spare_maker_running = pthread_create (&rt->spare_maker, NULL, sbx_spare_maker_main, rt) == 0;
    }
  if (cfg->warm_pool > 0)
    {
      rc = pthread_create (&rt->pool_filler, NULL, sbx_pool_filler_main, rt);
      if (rc != 0)
        return err_make_sys (err, rc, "start the warm pool's filler");
      rt->pool_filler_running = true;
    }
  return 0;
}

int
sbx_runtime_new (const sbx_config_t *cfg, sbx_runtime_t **out, err_t *err)
{
  sbx_runtime_t *rt = calloc (1, sizeof *rt);
  if (rt == NULL)
    return err_make (err, ENOMEM, "runtime: out of memory");
  rt->cfg = *cfg;
  rt->egress_progs[0] = rt->egress_progs[1] = -1;
  rt->base_ns_fd = -1;
  rt->filter_fd = -1;
  rt->uid_claim_fd = -1;
  pthread_mutex_init (&rt->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init (&ca);
  pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  pthread_cond_init (&rt->cv, &ca);
  pthread_mutex_init (&rt->proc_mu, NULL);
  pthread_cond_init (&rt->proc_cv, &ca);
  pthread_condattr_destroy (&ca);
  if (runtime_init (rt, cfg, err) < 0)
    {
      runtime_free (rt);
      return -1;
    }
  *out = rt;
  return 0;
}

void
sbx_runtime_stop (sbx_runtime_t *rt)
{
  pthread_mutex_lock (&rt->mu);
  rt->stopping = true;
  for (sbx_t *s = rt->list; s != NULL; s = s->next)
    if (!s->ready && s->helper > 0)
      kill (s->helper, SIGKILL); /* its launch fails and tears down */
  pthread_cond_broadcast (&rt->cv);
  pthread_mutex_unlock (&rt->mu);
}

/* Waits until no launch is in flight (their helpers were killed). */
static void
wait_launches (sbx_runtime_t *rt)
{
  pthread_mutex_lock (&rt->mu);
  for (;;)
    {
      bool launching = false;
      for (sbx_t *s = rt->list; s != NULL; s = s->next)
        launching = launching || !s->ready;
      if (!launching)
        break;
      pthread_cond_wait (&rt->cv, &rt->mu);
    }
  pthread_mutex_unlock (&rt->mu);
}

void
sbx_runtime_destroy (sbx_runtime_t *rt)
{
  if (rt == NULL)
    return;
  sbx_runtime_stop (rt);
  if (rt->reaper_running)
    pthread_join (rt->reaper, NULL);
  if (rt->idler_running)
    pthread_join (rt->idler, NULL);
  if (rt->spare_maker_running)
    pthread_join (rt->spare_maker, NULL);
  if (rt->pool_filler_running)
    pthread_join (rt->pool_filler, NULL);
  /* Pooled sandboxes go without being persisted: no tenant used them. */
  sbx_pool_drain (rt);
  wait_launches (rt);
  for (;;)
    {
      pthread_mutex_lock (&rt->mu);
      sbx_t *s = rt->list;
      while (s != NULL && (s->deleting || !s->ready))
        s = s->next;
      char id[SBX_ID_MAX + 1] = "";
      if (s != NULL)
        snprintf (id, sizeof id, "%s", s->id);
      pthread_mutex_unlock (&rt->mu);
      if (id[0] == '\0')
        break;
      err_t err = ERR_INIT;
      sbx_delete (rt, id, &err);
      err_warn_release (&err, "delete `%s` at shutdown", id);
    }
  sbx_proc_wait_threads (rt);
  /* Spares, and any a launch killed at shutdown was given. */
  sbx_cg_spares_remove (&rt->cg);
  runtime_free (rt);
}
