/* runtime/launch: making a sandbox — empty (launch) or from a tar stream
 * (restore) — through sandbox-helper, which sets up its namespaces, layer
 * and cgroups, forks its pid 1 (the holder) and reports READY with the
 * sandbox's disk. Then slirp4netns when egress is on. A launch
 * that fails at any step tears down everything it made. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/path.h"

/* How long a launch may take before the helper's silence is a failure. */
#define LAUNCH_REPORT_TIMEOUT_MS 60000
/* The restore pipe's size. */
#define RESTORE_PIPE_BYTES (1 << 20)
/* How long a helper that stopped reading the tar has to say why. */
#define RESTORE_REASON_TIMEOUT_MS 10000

/* Copies the spec's environment and labels into `s` (which frees them). */
static int
take_spec (sbx_t *s, const sbx_spec_t *spec, err_t *err)
{
  bool has_env = spec->env != NULL && spec->env[0] != NULL;
  bool has_labels = spec->labels != NULL && spec->labels[0] != NULL;
  if ((has_env && (s->env = sbx_strv_dup (spec->env)) == NULL)
      || (has_labels && (s->labels = sbx_strv_dup (spec->labels)) == NULL))
    {
      free (take_ptr (&s->env));
      return err_make (err, ENOMEM, "launch: out of memory");
    }
  return 0;
}

/* Reserves `id` in the registry: EEXIST taken, EUSERS full, ESHUTDOWN
 * stopping. `yielded`: the warm pool gave up a sandbox for this one
 * (sbx_pool_yield), whose place it takes. */
static int
reserve (sbx_runtime_t *rt, const char *id, const sbx_spec_t *spec, const sbx_resources_t *res,
         const sbx_image_t *img, bool yielded, sbx_t **out, err_t *err)
{
  bool allow_egress = spec->allow_egress;
  if (!sbx_id_valid (id))
    return err_make (err, EINVAL, "invalid sandbox id: ids match ^[A-Za-z0-9][A-Za-z0-9_-]*$, at most 64 characters");
  cleanup_free sbx_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    return err_make (err, ENOMEM, "launch: out of memory");
  s->res = *res;
  if (take_spec (s, spec, err) < 0)
    return -1;
  snprintf (s->id, sizeof s->id, "%s", id);
  if (sbx_path_fmt (s->state, sizeof s->state, err, "%s/%s", rt->sandboxes_dir, id) < 0)
    return err_wrap (err, "the state directory of `%s`", id);
  s->slirp_exit_fd = -1;
  s->disk_fd = -1;
  s->port_spare = -1;
  s->uid_slot = -1;
  if (img != NULL)
    {
      snprintf (s->image, sizeof s->image, "%s", img->ref);
      snprintf (s->image_digest, sizeof s->image_digest, "%s", img->digest);
      s->layers = img->layers;
    }
  pthread_mutex_init (&s->freeze_mu, NULL);
  s->allow_egress = allow_egress && rt->cfg.allow_egress;
  s->created_ms = sbx_wall_ms ();
  s->created_mono_ms = s->last_used_ms = sbx_mono_ms ();

  pthread_mutex_lock (&rt->mu);
  if (yielded)
    rt->pool_yielded--;
  int rc = 0;
  if (rt->stopping)
    rc = err_make (err, ESHUTDOWN, "the gateway is shutting down");
  else if (sbx_find_locked (rt, id) != NULL)
    rc = err_make (err, EEXIST, "sandbox `%s` already exists", id);
  else if ((long) (rt->count + sbx_pool_held_locked (rt)) >= rt->cfg.max_sandboxes)
    rc = err_make (err, EUSERS, "too many sandboxes: the limit is %ld (SANDBOX_MAX)", rt->cfg.max_sandboxes);
  else if (rt->cfg.userns && (s->uid_slot = sbx_uid_take_locked (rt)) < 0)
    rc = err_make (err, EUSERS, "no free uid range for another sandbox (SANDBOX_UID_BASE, SANDBOX_UID_RANGE)");
  else
    {
      sbx_link_locked (rt, s);
      *out = take_ptr (&s);
    }
  pthread_mutex_unlock (&rt->mu);
  if (s != NULL)
    {
      free (take_ptr (&s->env));
      free (take_ptr (&s->labels));
    }
  return rc;
}

/* A growing argv: no fixed cap to silently drop entries at. */
typedef struct argv_s
{
  const char **v;
  size_t n, cap;
  bool oom;
} argv_t;

static void
argv_add (argv_t *a, const char *s)
{
  if (a->n + 2 > a->cap)
    {
      size_t cap = a->cap ? a->cap * 2 : 64;
      const char **v = realloc (a->v, cap * sizeof *v);
      if (v == NULL)
        {
          a->oom = true;
          return;
        }
      a->v = v;
      a->cap = cap;
    }
  a->v[a->n++] = s;
  a->v[a->n] = NULL;
}

static void
argv_add_each (argv_t *a, const char *flag, const char *const *list)
{
  for (size_t i = 0; list != NULL && list[i] != NULL; i++)
    {
      argv_add (a, flag);
      argv_add (a, list[i]);
    }
}

/* Numbers the helper's command line shows, as text. */
typedef struct launch_numbers_s
{
  char disk_mb[24], pids[24], mem[24], cpu[24], max_entries[24], uid_base[24], uid_range[24], spare[32];
  char layer_uid[24];
} launch_numbers_t;

void *
sbx_spare_maker_main (void *arg)
{
  sbx_runtime_t *rt = arg;
  err_t err = ERR_INIT;
  /* The group the spares live in, made here if no launch has made it yet. */
  sbx_cg_prepare (&rt->cg, &err);
  err_release (&err);
  bool warned = false, refilling = false;
  pthread_mutex_lock (&rt->mu);
  while (!rt->stopping)
    {
      /* Filled up from half: a deleted sandbox's group, kept as a spare,
       * is cheaper than a new one (see sbx_remove_groups). */
      if (rt->n_spares >= SBX_SPARES || (rt->n_spares >= SBX_SPARES / 2 && !refilling))
        {
          refilling = false;
          pthread_cond_wait (&rt->cv, &rt->mu); /* launches signal it */
          continue;
        }
      refilling = true;
      unsigned n = rt->spare_seq++;
      pthread_mutex_unlock (&rt->mu);
      int rc = sbx_cg_spare_make (&rt->cg, n, &err);
      pthread_mutex_lock (&rt->mu);
      if (rc == 0 && rt->n_spares < SBX_SPARES)
        {
          rt->spares[rt->n_spares++] = n;
          continue;
        }
      if (rc == 0)
        {
          pthread_mutex_unlock (&rt->mu);
          sbx_cg_spare_remove (&rt->cg, n); /* deletes filled the pool meanwhile */
          pthread_mutex_lock (&rt->mu);
          continue;
        }
      /* Launches make their own groups meanwhile. */
      if (!warned)
        err_warn_release (&err, "make a spare memory cgroup (retried every second)");
      err_release (&err);
      warned = true;
      struct timespec until;
      clock_gettime (CLOCK_MONOTONIC, &until);
      until.tv_sec += 1;
      pthread_cond_timedwait (&rt->cv, &rt->mu, &until);
    }
  pthread_mutex_unlock (&rt->mu);
  return NULL;
}

int
sbx_remove_groups (sbx_runtime_t *rt, const char *id, err_t *err)
{
  pthread_mutex_lock (&rt->mu);
  bool room = rt->spare_maker_running && !rt->stopping && rt->n_spares < SBX_SPARES;
  unsigned n = room ? rt->spare_seq++ : 0;
  pthread_mutex_unlock (&rt->mu);
  if (!room)
    return sbx_cg_remove (&rt->cg, id, NULL, err);
  int rc = sbx_cg_remove_to_spare (&rt->cg, id, n, err);
  if (rc <= 0)
    return rc;
  pthread_mutex_lock (&rt->mu);
  bool keep = !rt->stopping && rt->n_spares < SBX_SPARES;
  if (keep)
    rt->spares[rt->n_spares++] = n;
  pthread_mutex_unlock (&rt->mu);
  if (!keep)
    sbx_cg_spare_remove (&rt->cg, n);
  return 0;
}

/* The name of a spare memory group for a launch to take, into nums->spare
 * ("" none). */
static void
take_spare (sbx_runtime_t *rt, launch_numbers_t *nums)
{
  nums->spare[0] = '\0';
  pthread_mutex_lock (&rt->mu);
  if (rt->n_spares > 0)
    {
      snprintf (nums->spare, sizeof nums->spare, SBX_CG_SPARE_PREFIX "%u", rt->spares[--rt->n_spares]);
      pthread_cond_broadcast (&rt->cv); /* the maker makes another */
    }
  pthread_mutex_unlock (&rt->mu);
}

/* The helper's command line for `s` (strings borrowed from rt, s and nums). */
static int
helper_argv (sbx_runtime_t *rt, const sbx_t *s, bool restore, launch_numbers_t *nums, argv_t *a, err_t *err)
{
  const sbx_config_t *c = &rt->cfg;
  snprintf (nums->disk_mb, sizeof nums->disk_mb, "%ld", s->res.disk_mb);
  snprintf (nums->pids, sizeof nums->pids, "%ld", s->res.pids_max);
  snprintf (nums->mem, sizeof nums->mem, "%ld", s->res.memory_mb);
  snprintf (nums->cpu, sizeof nums->cpu, "%ld", s->res.cpu_millis);
  snprintf (nums->max_entries, sizeof nums->max_entries, "%ld", c->snapshot_max_entries);
  const char *fixed[]
      = {"sandbox-helper", "launch",      "--id",           s->id,           "--state",        s->state,
         "--lower",        c->rootfs,     "--cgroup-mount", c->cgroup_mount, "--cgroup-group", c->cgroup_group,
         "--disk-mb",      nums->disk_mb, "--pids",         nums->pids,      "--memory-mb",    nums->mem,
         "--cpu-millis",   nums->cpu};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
    argv_add (a, fixed[i]);
  if (s->layers != NULL)
    {
      snprintf (nums->layer_uid, sizeof nums->layer_uid, "%ld", c->image_uid);
      const char *img[] = {"--layers", s->layers, "--layer-uid", nums->layer_uid};
      for (size_t i = 0; i < sizeof img / sizeof img[0]; i++)
        argv_add (a, img[i]);
    }
  argv_add_each (a, "--volume", c->volumes);
  argv_add_each (a, "--mask", c->masks);
  take_spare (rt, nums);
  if (nums->spare[0] != '\0')
    {
      argv_add (a, "--memcg-spare");
      argv_add (a, nums->spare);
    }
  if (s->uid_slot >= 0)
    {
      snprintf (nums->uid_base, sizeof nums->uid_base, "%lu", (unsigned long) sbx_uid_base (rt, s->uid_slot));
      snprintf (nums->uid_range, sizeof nums->uid_range, "%ld", c->uid_range);
      const char *ids[] = {"--uid-base", nums->uid_base, "--uid-range", nums->uid_range};
      for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        argv_add (a, ids[i]);
    }
  if (s->allow_egress)
    {
      argv_add (a, "--egress");
      argv_add_each (a, "--block", (const char *const *) rt->host_addrs);
    }
  if (restore)
    {
      const char *more[] = {"--restore", "--max-entries", nums->max_entries, "--unpacker", c->unpacker};
      for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        argv_add (a, more[i]);
    }
  return a->oom ? err_make (err, ENOMEM, "launch: out of memory") : 0;
}

/* Spans a source may hand over at once (a 1 MiB gRPC message arrives in
 * frames of 16 KiB or more). */
#define FEED_SPANS 128

/* Feeds the tar from `src` into the helper's stdin until the source ends,
 * watching the report socket: an early report means the helper refused the
 * stream (its reason comes with it). 0 fed; -1 with *err. */
static int
feed_tar (int pipe_fd, int report_fd, sbx_source_fn src, void *src_ctx, sbx_report_t *early, bool *got_early,
          err_t *err)
{
  *got_early = false;
  struct iovec iov[FEED_SPANS];
  for (;;)
    {
      int n = FEED_SPANS;
      int rc = src (src_ctx, iov, &n, err);
      if (rc <= 0)
        return rc;
      int i = 0;
      while (i < n)
        {
          if (iov[i].iov_len == 0)
            {
              i++;
              continue;
            }
          struct pollfd p[2] = {{.fd = pipe_fd, .events = POLLOUT}, {.fd = report_fd, .events = POLLIN}};
          if (TEMP_FAILURE_RETRY (poll (p, 2, -1)) < 0)
            return err_make_sys (err, errno, "restore: poll");
          if (p[1].revents != 0)
            {
              *got_early = sbx_read_report (report_fd, early, 0, NULL, 0) == 1;
              return 0;
            }
          ssize_t w = TEMP_FAILURE_RETRY (writev (pipe_fd, iov + i, n - i));
          if (w < 0 && errno == EAGAIN)
            continue;
          if (w < 0)
            {
              /* The helper stopped reading; its report says why. */
              *got_early = sbx_read_report (report_fd, early, RESTORE_REASON_TIMEOUT_MS, NULL, 0) == 1;
              return 0;
            }
          for (size_t left = (size_t) w; left > 0 && i < n;)
            {
              size_t k = left < iov[i].iov_len ? left : iov[i].iov_len;
              iov[i].iov_base = (uint8_t *) iov[i].iov_base + k;
              iov[i].iov_len -= k;
              left -= k;
              if (iov[i].iov_len == 0)
                i++;
            }
        }
    }
}

/* Turns the helper's report into the sandbox's holder, or an error. */
static int
take_ready (sbx_runtime_t *rt, sbx_t *s, int got, const sbx_report_t *r, const int *fds, bool restore, err_t *err)
{
  cleanup_close int disk_fd = fds[0];
  const char *what = restore ? "restore" : "launch";
  if (got == 1 && r->type == SBX_REPORT_ERROR)
    return err_make (err, r->status, "%s `%s`: %s", what, s->id, r->text);
  if (got != 1 || r->type != SBX_REPORT_READY)
    return err_make (err, EIO, "launch `%s`: the helper ended without a report", s->id);
  if (disk_fd < 0)
    return err_make (err, EIO, "launch `%s`: the helper sent no disk", s->id);
  s->disk_fd = sbx_fd_keep (take_fd (&disk_fd));
  s->holder = r->u.ready.holder_pid;
  return s->allow_egress ? sbx_net_start (rt, s, err) : 0;
}

/* Runs sandbox-helper for `s` and, when restoring, feeds it the tar. */
static int
run_helper (sbx_runtime_t *rt, sbx_t *s, char *const *argv, sbx_source_fn src, void *src_ctx, err_t *err)
{
  cleanup_close int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
  cleanup_pipe int tar_pipe[2] = {-1, -1};
  if (src != NULL && pipe2 (tar_pipe, O_CLOEXEC) < 0)
    return err_make_sys (err, errno, "restore: pipe");
  /* A restore's pieces are 1 MiB or so: a pipe that holds one lets the
   * gateway and the unpacker work at once instead of taking turns every
   * 64 KiB. Best effort. */
  if (src != NULL)
    fcntl (tar_pipe[1], F_SETPIPE_SZ, RESTORE_PIPE_BYTES);
  pid_t helper = -1;
  cleanup_close int report_fd = -1;
  if (sbx_spawn_helper (rt, argv, src != NULL ? tar_pipe[0] : null, null, STDERR_FILENO, true, &helper, &report_fd,
                        err)
      < 0)
    return err_wrap (err, "launch `%s`", s->id);
  pthread_mutex_lock (&rt->mu);
  s->helper = helper;
  if (rt->stopping)
    kill (helper, SIGKILL);
  pthread_mutex_unlock (&rt->mu);

  sbx_report_t r;
  int got = 0, fds[SBX_REPORT_MAX_FDS] = {-1}, rc = 0;
  if (src != NULL)
    {
      close (take_fd (&tar_pipe[0]));
      bool early = false;
      rc = feed_tar (tar_pipe[1], report_fd, src, src_ctx, &r, &early, err);
      close (take_fd (&tar_pipe[1]));
      if (rc < 0)
        kill (helper, SIGKILL); /* *err says why the source failed */
      got = early ? 1 : 0;
    }
  if (rc == 0 && got == 0)
    got = sbx_read_report (report_fd, &r, LAUNCH_REPORT_TIMEOUT_MS, fds, SBX_REPORT_MAX_FDS);
  if (rc == 0)
    rc = take_ready (rt, s, got, &r, fds, src != NULL, err);
  sbx_reap (helper);
  pthread_mutex_lock (&rt->mu);
  s->helper = 0;
  pthread_mutex_unlock (&rt->mu);
  return rc;
}

/* Undoes a launch that failed and sets the error's meaning: a failure to
 * build the sandbox is the gateway's (EIO), a bad snapshot (EINVAL), one
 * over the quota (ENOSPC) or a source that went away (ECANCELED) is the
 * caller's. */
static void
abandon (sbx_runtime_t *rt, sbx_t *s, bool restore, err_t *err)
{
  sbx_net_stop (s->slirp, s->slirp_exit_fd);
  sbx_egress_release (rt, s->id);
  if (s->disk_fd >= 0)
    close (s->disk_fd);
  sbx_teardown (rt, s->id, s->state, s->holder);
  pthread_mutex_lock (&rt->mu);
  sbx_unlink_locked (rt, s);
  pthread_cond_broadcast (&rt->cv);
  pthread_mutex_unlock (&rt->mu);
  pthread_mutex_destroy (&s->freeze_mu);
  free (s->env);
  free (s->labels);
  free (s);
  bool callers = restore && (err->status == EINVAL || err->status == ENOSPC || err->status == ECANCELED);
  if (!callers && (err->status == EINVAL || err->status == ENOENT || err->status == EEXIST))
    err->status = EIO;
}

int
sbx_launch (sbx_runtime_t *rt, const char *id, bool allow_egress, sbx_info_t *out, err_t *err)
{
  return sbx_launch_on (rt, id, allow_egress, NULL, NULL, NULL, out, err);
}

int
sbx_restore (sbx_runtime_t *rt, const char *id, bool allow_egress, sbx_source_fn src, void *src_ctx, sbx_info_t *out,
             err_t *err)
{
  return sbx_launch_on (rt, id, allow_egress, NULL, src, src_ctx, out, err);
}

void
sbx_launch_counters (sbx_runtime_t *rt, const char *id, sbx_cg_events_t *out)
{
  sbx_cg_counters_t none = {.fds = {{-1, -1}, {-1, -1}}};
  sbx_cg_counters_read (&rt->cg, id, &none, false, out);
}

int
sbx_launch_build (sbx_runtime_t *rt, sbx_t *s, err_t *err)
{
  launch_numbers_t nums;
  argv_t argv = {0};
  int rc = helper_argv (rt, s, false, &nums, &argv, err);
  /* Its claim may set a CPU limit: the group that needs is made now. */
  argv_add (&argv, "--cpu-group");
  if (rc == 0 && argv.oom)
    rc = err_make (err, ENOMEM, "launch: out of memory");
  if (rc == 0)
    rc = run_helper (rt, s, (char *const *) argv.v, NULL, NULL, err);
  free (argv.v);
  return rc;
}

int
sbx_launch_on (sbx_runtime_t *rt, const char *id, bool allow_egress, const sbx_image_t *img, sbx_source_fn src,
               void *src_ctx, sbx_info_t *out, err_t *err)
{
  sbx_spec_t spec = {.allow_egress = allow_egress, .persist_on_expiry = -1};
  return sbx_launch_spec (rt, id, &spec, img, src, src_ctx, out, err);
}

/* Gives claimed `s` the spec's resources (its limits and disk changed
 * from the defaults it was made with), environment and labels (it is
 * linked but not ready: no one else reads them yet). A failure destroys
 * it. */
static int
adopt_spec (sbx_runtime_t *rt, sbx_t *s, const sbx_spec_t *spec, const sbx_resources_t *res, err_t *err)
{
  if (sbx_pool_shape (rt, s, res, err) < 0 || take_spec (s, spec, err) < 0)
    {
      abandon (rt, s, false, err);
      return -1;
    }
  return 0;
}

int
sbx_launch_spec (sbx_runtime_t *rt, const char *id, const sbx_spec_t *spec_in, const sbx_image_t *img,
                 sbx_source_fn src, void *src_ctx, sbx_info_t *out, err_t *err)
{
  sbx_t *s = NULL;
  launch_numbers_t nums = {0};
  const sbx_spec_t no_spec = {.persist_on_expiry = -1};
  const sbx_spec_t *spec = spec_in != NULL ? spec_in : &no_spec;
  sbx_resources_t res;
  sbx_lifetime_t life;
  if (sbx_spec_check (rt, spec, &res, &life, err) < 0)
    return -1;
  bool allow_egress = spec->allow_egress;
  /* Claim from the warm pool (given the resources asked for), else
   * create. */
  int claimed = sbx_pool_claim (rt, id, allow_egress, img, src != NULL, &s, err);
  if (claimed < 0 || (claimed == 1 && adopt_spec (rt, s, spec, &res, err) < 0))
    return -1;
  if (claimed == 0)
    {
      bool yielded = sbx_pool_yield (rt);
      if (reserve (rt, id, spec, &res, img, yielded, &s, err) < 0)
        return -1;
      argv_t argv = {0};
      int rc = helper_argv (rt, s, src != NULL, &nums, &argv, err);
      if (rc == 0)
        rc = run_helper (rt, s, (char *const *) argv.v, src, src_ctx, err);
      free (argv.v);
      if (rc < 0)
        {
          abandon (rt, s, src != NULL, err);
          return -1;
        }
    }
  /* A spare memory group may be a deleted sandbox's, whose out-of-memory
   * kills it still counts: what the first exec compares with (a pooled
   * sandbox's may have such a group too: read when it was made, nothing
   * has run in it since). */
  sbx_cg_events_t seen = claimed ? s->cg_seen : (sbx_cg_events_t){0};
  if (nums.spare[0] != '\0')
    sbx_launch_counters (rt, s->id, &seen);
  pthread_mutex_lock (&rt->mu);
  s->layers = NULL;
  s->cg_seen = seen;
  sbx_lifetime_set_locked (s, &life); /* its life counts from here */
  s->ready = true;
  if (out != NULL)
    sbx_info_copy_locked (s, out);
  pthread_mutex_unlock (&rt->mu);
  if (out != NULL)
    sbx_info_measure (rt, s, out);
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:b, s:i, s:b}", "sandbox_id", id, "allow_egress", s->allow_egress, "holder_pid",
                         (int) s->holder, "pooled", claimed == 1),
              src != NULL ? "sandbox restored" : "sandbox launched");
  return 0;
}
