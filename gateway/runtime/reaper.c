/* runtime/reaper: removing what a previous run of the gateway left behind
 * (processes, mounts, cgroups, state directories), and the reaper thread:
 * once a second it cancels exports that have kept a sandbox frozen past
 * SANDBOX_EXPORT_FREEZE_SECONDS and deletes sandboxes unused for
 * SANDBOX_IDLE_TTL seconds (measured on the monotonic clock: a wall-clock
 * step deletes nothing). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <time.h>

#include "common/log.h"
#include "gateway/runtime/internal.h"

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
        snprintf (path, sizeof path, "%s/%s", dir, e->d_name);
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

/* The id of a sandbox idle for ttl_ms, or false. Needs rt->mu. */
static bool
find_idle_locked (sbx_runtime_t *rt, int64_t ttl_ms, char id[SBX_ID_MAX + 1])
{
  int64_t now = sbx_mono_ms ();
  for (sbx_t *s = rt->list; s != NULL; s = s->next)
    if (s->ready && !s->deleting && s->refs - (rt->cfg.idle_counts_processes ? 0 : s->bg_refs) == 0
        && now - s->last_used_ms >= ttl_ms)
      {
        snprintf (id, SBX_ID_MAX + 1, "%s", s->id);
        return true;
      }
  return false;
}

void *
sbx_reaper_main (void *arg)
{
  sbx_runtime_t *rt = arg;
  int64_t ttl_ms = rt->cfg.idle_ttl_seconds * 1000;
  unsigned round = 0;
  int64_t next_tick = 0;
  bool rescan = false; /* an idle sandbox was just deleted: look for the next at once */
  pthread_mutex_lock (&rt->mu);
  while (!rt->stopping)
    {
      int64_t now = sbx_mono_ms ();
      if (!rescan && now < next_tick)
        {
          /* Woken early (every launch and delete signals rt->cv): the
           * scans below walk every sandbox, so they keep to once a second
           * however busy the gateway is. */
          struct timespec until = {.tv_sec = next_tick / 1000, .tv_nsec = (long) (next_tick % 1000) * 1000000};
          pthread_cond_timedwait (&rt->cv, &rt->mu, &until);
          continue;
        }
      if (!rescan)
        {
          next_tick = now + 1000;
          pthread_mutex_unlock (&rt->mu);
          sbx_enforce_freeze_deadlines (rt);
          if (rt->cfg.health != NULL && round++ % 2 == 0)
            {
              /* The self-check, every two seconds: what health reports. */
              err_t cerr = ERR_INIT;
              rt->cfg.health (sbx_runtime_check (rt, &cerr) < 0 ? err_msg (&cerr) : NULL);
              err_release (&cerr);
            }
          pthread_mutex_lock (&rt->mu);
        }
      rescan = false;
      char id[SBX_ID_MAX + 1];
      if (rt->stopping || ttl_ms <= 0 || !find_idle_locked (rt, ttl_ms, id))
        continue;
      pthread_mutex_unlock (&rt->mu);
      log_fields (SEV_INFO, json_pack ("{s:s, s:i}", "sandbox_id", id, "idle_ttl", (int) rt->cfg.idle_ttl_seconds),
                  "deleting an idle sandbox");
      err_t err = ERR_INIT;
      sbx_delete (rt, id, &err);
      err_warn_release (&err, "delete idle `%s`", id);
      pthread_mutex_lock (&rt->mu);
      rescan = true;
    }
  pthread_mutex_unlock (&rt->mu);
  return NULL;
}
