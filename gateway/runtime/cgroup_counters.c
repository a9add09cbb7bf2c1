/* runtime/cgroup_counters: the counters that say a sandbox's limit was hit
 * (the pids limit refused a fork, the memory limit killed), summed over a
 * group and its sub-groups (see cgroup.h). Only file operations on
 * cgroupfs; no state. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gateway/runtime/cgroup.h"
#include "gateway/runtime/cgroup_internal.h"
#include "gateway/runtime/path.h"

/* Adds `key` of `file` over a group and all its sub-groups: cgroup v1
 * counts some events only where they happened (e.g. an exec's group). A
 * cgroup directory's link count is 2 plus its sub-groups (kernfs keeps
 * it): a group without any (an exec's, or the sandbox's own in a
 * hierarchy the gateway makes no sub-groups in) is not listed. */
static long
sum_keyed_at (const char *dir, const char *file, const char *key, int depth, int fd, const char *sub, int sub_fd)
{
  char path[SBX_CG_TREE_PATH_MAX];
  long total = fd >= 0                                                             ? sbx_cg_pread_keyed (fd, key)
               : sbx_cg_path (path, sizeof path, dir, NULL, NULL, file, NULL) >= 0 ? sbx_cg_read_keyed (path, key)
                                                                                   : 0;
  struct stat st;
  if (depth > 4 || (stat (dir, &st) == 0 && st.st_nlink <= 2))
    return total;
  DIR *d = opendir (dir);
  if (d == NULL)
    return total;
  struct dirent *e;
  while ((e = readdir (d)) != NULL)
    if (e->d_type == DT_DIR && e->d_name[0] != '.'
        && sbx_path_fmt (path, sizeof path, NULL, "%s/%s", dir, e->d_name) >= 0)
      {
        bool ours = sub != NULL && strcmp (e->d_name, sub) == 0;
        total += sum_keyed_at (path, file, key, depth + 1, ours ? sub_fd : -1, NULL, -1);
      }
  closedir (d);
  return total;
}

/* The counter files, in the order of sbx_cg_counters_t's fds. */
static const char *
counter_file (const sbx_cg_layout_t *l, int k)
{
  return k == 0 ? "pids.events" : l->v2 ? "memory.events" : "memory.oom_control";
}

static const char *const counter_keys[2] = {"max", "oom_kill"};

void
sbx_cg_counters_open (const sbx_cg_layout_t *l, const char *id, const char *sub, sbx_cg_counters_t *c)
{
  snprintf (c->sub, sizeof c->sub, "%s", sub);
  char path[SBX_CG_PATH_MAX];
  for (int k = 0; k < 2; k++)
    for (int g = 0; g < 2; g++)
      {
        c->fds[k][g] = -1;
        int h = k == 0 ? 0 : l->memory;
        /* Sub-groups are made in the tracking hierarchy only (a v1 memory
         * hierarchy has none to open; reading falls back to the path). */
        if (h < 0 || (g == 1 && h != 0))
          continue;
        if (sbx_cg_path (path, sizeof path, l->roots[h], id, g == 1 ? sub : NULL, counter_file (l, k), NULL) >= 0)
          c->fds[k][g] = open (path, O_RDONLY | O_CLOEXEC);
      }
}

void
sbx_cg_counters_read (const sbx_cg_layout_t *l, const char *id, const sbx_cg_counters_t *c, bool of_sub,
                      sbx_cg_events_t *out)
{
  long sums[2] = {0, 0};
  char dir[SBX_CG_PATH_MAX];
  for (int k = 0; k < 2; k++)
    {
      int h = k == 0 ? 0 : l->memory;
      if (h < 0 || sbx_cg_path (dir, sizeof dir, l->roots[h], id, of_sub ? c->sub : NULL, NULL, NULL) < 0)
        continue;
      sums[k] = sum_keyed_at (dir, counter_file (l, k), counter_keys[k], 0, c->fds[k][of_sub ? 1 : 0],
                              of_sub ? NULL : c->sub, c->fds[k][1]);
    }
  out->pids_max_hits = sums[0];
  out->oom_kills = sums[1];
}

void
sbx_cg_counters_close (sbx_cg_counters_t *c)
{
  for (int k = 0; k < 2; k++)
    for (int g = 0; g < 2; g++)
      if (c->fds[k][g] >= 0)
        {
          close (c->fds[k][g]);
          c->fds[k][g] = -1;
        }
}
