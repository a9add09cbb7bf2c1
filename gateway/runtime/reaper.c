/* runtime/reaper: removing what a previous run of the gateway left behind
 * (processes, mounts, cgroups, state directories), and two threads: the
 * reaper, which once a second cancels exports that have kept a sandbox
 * frozen past SANDBOX_EXPORT_FREEZE_SECONDS, marks dead the sandboxes whose
 * pid 1 died and runs the health self-check; and the idler, which ends
 * expired sandboxes (lifetime.c: unused for their idle TTL, or past their
 * most lifetime; measured on the monotonic clock: a wall-clock step deletes
 * nothing), persisting them first when they are to be. A delete stuck on one sandbox
 * holds up none of the reaper's work. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>

#include "common/log.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/path.h"

/* Passes over mountinfo before giving up on mounts that keep coming back. */
#define UNMOUNT_PASSES 8

/* Unmounts every mount below `dir` (deepest first), as left by a crash. */
static void
unmount_below (const char *dir)
{
  size_t dlen = strlen (dir);
  for (int pass = 0; pass < UNMOUNT_PASSES; pass++)
    {
      FILE *f = fopen ("/proc/self/mountinfo", "re");
      if (f == NULL)
        return;
      char line[4096];
      int found = 0;
      while (fgets (line, sizeof line, f) != NULL)
        {
          char mp[PATH_MAX];
          if (sscanf (line, "%*s %*s %*s %*s %4095s", mp) != 1)
            continue;
          if (strncmp (mp, dir, dlen) == 0 && (mp[dlen] == '/' || mp[dlen] == '\0'))
            {
              umount2 (mp, MNT_DETACH);
              found++;
            }
        }
      fclose (f);
      if (found == 0)
        return;
    }
}

/* Removes every state directory under the sandboxes directory. */
static size_t
remove_state_dirs (const char *dir)
{
  size_t n = 0;
  DIR *d = opendir (dir);
  if (d == NULL)
    return 0;
  struct dirent *e;
  while ((e = readdir (d)) != NULL)
    if (e->d_name[0] != '.')
      {
        char path[PATH_MAX * 2];
        cleanup_err err_t perr = ERR_INIT;
        if (sbx_path_fmt (path, sizeof path, &perr, "%s/%s", dir, e->d_name) < 0)
          {
            err_warn_release (&perr, "leftovers of a previous run");
            continue;
          }
        sbx_remove_tree (path);
        n++;
      }
  closedir (d);
  return n;
}

void
sbx_clean_leftovers (sbx_runtime_t *rt)
{
  char **ids = sbx_cg_list (&rt->cg);
  size_t n = 0;
  for (size_t i = 0; ids != NULL && ids[i] != NULL; i++, n++)
    {
      err_t err = ERR_INIT;
      sbx_cg_kill (&rt->cg, ids[i], NULL, &err);
      err_warn_release (&err, "clean up `%s`", ids[i]);
    }
  sbx_cg_spares_remove (&rt->cg);
  unmount_below (rt->sandboxes_dir);
  n += remove_state_dirs (rt->sandboxes_dir);
  for (size_t i = 0; ids != NULL && ids[i] != NULL; i++)
    {
      err_t err = ERR_INIT;
      sbx_cg_remove (&rt->cg, ids[i], NULL, &err);
      err_warn_release (&err, "clean up `%s`", ids[i]);
      free (ids[i]);
    }
  free (ids);
  if (n > 0)
    log_fields (SEV_INFO, json_pack ("{s:i}", "leftovers", (int) n), "removed what a previous run left behind");
}

/* Most dead holders dealt with per tick (the rest on the next). */
#define DEAD_PER_TICK 16

/* Sandboxes whose pid 1 died (the OOM killer, or a kill from the host)
 * are marked dead and their processes killed, and the end hook is told:
 * the holder is found a zombie (waited for without reaping: only what
 * marks it dead reaps it, so its pid is never reused under a delete's
 * kill). */
static void
find_dead_holders (sbx_runtime_t *rt)
{
  struct
  {
    char id[SBX_ID_MAX + 1];
    pid_t holder;
    int64_t created_ms;
  } dead[DEAD_PER_TICK];
  size_t n = 0;
  pthread_mutex_lock (&rt->mu);
  for (sbx_t *s = rt->list; s != NULL && n < DEAD_PER_TICK; s = s->next)
    {
      if (!s->ready || s->deleting || s->dead || s->holder <= 0)
        continue;
      siginfo_t si = {0};
      if (waitid (P_PID, (id_t) s->holder, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid != s->holder)
        continue;
      s->dead = true;
      if (si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED)
        snprintf (s->dead_reason, sizeof s->dead_reason,
                  "its pid 1 was killed by signal %d%s; its processes were killed with it", si.si_status,
                  si.si_status == SIGKILL ? " (out of memory, or killed from the host)" : "");
      else
        snprintf (s->dead_reason, sizeof s->dead_reason, "its pid 1 exited with status %d", si.si_status);
      snprintf (dead[n].id, sizeof dead[n].id, "%s", s->id);
      dead[n].created_ms = s->created_ms;
      dead[n++].holder = s->holder;
      s->holder = 0; /* reaped below, and by nothing else */
    }
  pthread_mutex_unlock (&rt->mu);
  for (size_t i = 0; i < n; i++)
    {
      sbx_reap (dead[i].holder);
      err_t err = ERR_INIT;
      if (sbx_cg_kill (&rt->cg, dead[i].id, NULL, &err) < 0)
        err_warn_release (&err, "dead sandbox `%s`", dead[i].id);
      sbx_tell_ended (rt, dead[i].id, dead[i].created_ms);
      log_fields (SEV_WARNING, json_pack ("{s:s}", "sandbox_id", dead[i].id),
                  "the sandbox's pid 1 died: the sandbox is dead until deleted or restored");
    }
}

/* Waits on rt->cv until `until` (monotonic ms) or the runtime stops; rt->mu
 * held. */
static void
wait_until_locked (sbx_runtime_t *rt, int64_t until)
{
  struct timespec ts = {.tv_sec = until / 1000, .tv_nsec = (long) (until % 1000) * 1000000};
  pthread_cond_timedwait (&rt->cv, &rt->mu, &ts);
}

/* The reaper: once a second it cancels exports past their freeze
 * deadline, finds dead holders and (every two seconds) runs the health
 * self-check. None of these waits on a sandbox: deletes, which may, are the
 * idler's (sbx_idler_main), so a slow one holds up none of these. */
void *
sbx_reaper_main (void *arg)
{
  sbx_runtime_t *rt = arg;
  unsigned round = 0;
  int64_t next_tick = 0;
  pthread_mutex_lock (&rt->mu);
  while (!rt->stopping)
    {
      int64_t now = sbx_mono_ms ();
      if (now < next_tick)
        {
          /* Woken early (every launch and delete signals rt->cv): the scans
           * below walk every sandbox, so they keep to once a second however
           * busy the gateway is. */
          wait_until_locked (rt, next_tick);
          continue;
        }
      next_tick = now + 1000;
      pthread_mutex_unlock (&rt->mu);
      sbx_enforce_freeze_deadlines (rt);
      find_dead_holders (rt);
      if (rt->cfg.health != NULL && round++ % 2 == 0)
        {
          /* The self-check, every two seconds: what health reports. */
          cleanup_err err_t cerr = ERR_INIT;
          rt->cfg.health (sbx_runtime_check (rt, &cerr) < 0 ? err_msg (&cerr) : NULL);
        }
      pthread_mutex_lock (&rt->mu);
    }
  pthread_mutex_unlock (&rt->mu);
  return NULL;
}

/* The idler: ends expired sandboxes (lifetime.c: idle past their TTL, or
 * past their end of life), one after another, looking once a second (at
 * once again after one). One to persist first goes to the expiry hook,
 * which persists and deletes it; the rest are deleted. */
void *
sbx_idler_main (void *arg)
{
  sbx_runtime_t *rt = arg;
  int64_t next_tick = 0;
  pthread_mutex_lock (&rt->mu);
  while (!rt->stopping)
    {
      int64_t now = sbx_mono_ms ();
      char id[SBX_ID_MAX + 1];
      const char *why = NULL;
      bool persist = false;
      if (now < next_tick || !sbx_find_expired_locked (rt, id, &why, &persist))
        {
          if (now >= next_tick)
            next_tick = now + 1000;
          wait_until_locked (rt, next_tick);
          continue;
        }
      sbx_expire_fn expire = rt->expire;
      void *expire_ctx = rt->expire_ctx;
      pthread_mutex_unlock (&rt->mu);
      log_fields (SEV_INFO, json_pack ("{s:s, s:s, s:b}", "sandbox_id", id, "reason", why, "persist", persist),
                  "ending an expired sandbox");
      if (persist)
        expire (expire_ctx, rt, id, why);
      else
        {
          err_t err = ERR_INIT;
          sbx_delete (rt, id, &err);
          err_warn_release (&err, "delete expired `%s`", id);
        }
      pthread_mutex_lock (&rt->mu);
      next_tick = 0; /* the next expired one at once */
    }
  pthread_mutex_unlock (&rt->mu);
  return NULL;
}
