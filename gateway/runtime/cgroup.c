/* runtime/cgroup: sandbox cgroups on v2 or v1 (see cgroup.h) — finding
 * the layout, making a sandbox's groups with their limits, moving
 * processes in, listing what a previous run left. Killing, freezing and
 * removal are in cgroup_kill.c, the limit counters in cgroup_counters.c,
 * spare and holders' groups in cgroup_spares.c. Only file operations on
 * cgroupfs; no state. */
#include "gateway/runtime/cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/cgroup_internal.h"
#include "gateway/runtime/path.h"

/* Names a hierarchy root `mount`/[`controller`/]`group` in
 * out->roots[out->n]. */
static int
add_root (sbx_cg_layout_t *out, const char *mount, const char *controller, const char *group, err_t *err)
{
  char *root = out->roots[out->n];
  size_t cap = sizeof out->roots[0];
  if (controller == NULL)
    return sbx_path_fmt (root, cap, err, "%s/%s", mount, group) < 0 ? -1 : 0;
  return sbx_path_fmt (root, cap, err, "%s/%s/%s", mount, controller, group) < 0 ? -1 : 0;
}

int
sbx_cg_detect (const char *mount, const char *group, bool cpu, sbx_cg_layout_t *out, err_t *err)
{
  if (group[0] == '\0' || strchr (group, '/') != NULL || strcmp (group, ".") == 0 || strcmp (group, "..") == 0)
    return err_make (err, EINVAL, "cgroup group `%s` is not a single path component", group);
  memset (out, 0, sizeof *out);
  out->freezer = out->memory = out->cpu = -1;
  char probe[SBX_CG_PATH_MAX];
  if (sbx_path_fmt (probe, sizeof probe, err, "%s/cgroup.controllers", mount) < 0)
    return -1;
  if (access (probe, F_OK) == 0)
    {
      out->v2 = true;
      if (add_root (out, mount, NULL, group, err) < 0)
        return -1;
      out->n = 1;
      out->freezer = out->memory = out->cpu = 0;
      return 0;
    }
  static const char *const names[] = {"pids", "memory", "cpu", "freezer"};
  for (size_t i = 0; i < 4; i++)
    {
      if (i == 2 && !cpu)
        continue;
      if (sbx_path_fmt (probe, sizeof probe, err, "%s/%s/cgroup.procs", mount, names[i]) < 0)
        return -1;
      if (access (probe, F_OK) != 0)
        {
          if (i == 0)
            return err_make (err, ENOTSUP, "no cgroup v2 at `%s` and no v1 pids hierarchy", mount);
          continue;
        }
      if (add_root (out, mount, names[i], group, err) < 0)
        return -1;
      if (i == 1)
        out->memory = (int) out->n;
      else if (i == 2)
        out->cpu = (int) out->n;
      else if (i == 3)
        out->freezer = (int) out->n;
      out->n++;
    }
  return 0;
}

int
sbx_cg_prepare (const sbx_cg_layout_t *l, err_t *err)
{
  for (size_t i = 0; i < l->n; i++)
    if (sbx_cg_mkdir (l->roots[i], err) < 0)
      return -1;
  char path[SBX_CG_PATH_MAX];
  if (l->v2)
    {
      /* Delegate the controllers down to each sandbox's group. */
      char parent[sizeof l->roots[0]];
      memcpy (parent, l->roots[0], sizeof parent);
      char *slash = strrchr (parent, '/');
      *slash = '\0';
      if (sbx_cg_path (path, sizeof path, parent, NULL, NULL, "cgroup.subtree_control", err) < 0)
        return -1;
      sbx_cg_write_file (path, "+pids +memory +cpu", NULL); /* may already be on */
      if (sbx_cg_path (path, sizeof path, l->roots[0], NULL, NULL, "cgroup.subtree_control", err) < 0
          || sbx_cg_write_file (path, "+pids +memory +cpu", err) < 0)
        return -1;
    }
  if (sbx_cg_holders_possible (l))
    {
      if (sbx_cg_path (path, sizeof path, l->roots[l->memory], SBX_CG_HOLDERS, NULL, NULL, err) < 0
          || sbx_cg_mkdir (path, err) < 0)
        return -1;
    }
  return 0;
}

/* Writes a knob the kernel may not offer: a missing one is fine, any
 * other failure is not. */
static int
write_knob (const char *root, const char *id, const char *knob, const char *val, err_t *err)
{
  char path[SBX_CG_PATH_MAX];
  if (sbx_cg_path (path, sizeof path, root, id, NULL, knob, err) < 0)
    return -1;
  cleanup_close int fd = open (path, O_WRONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT)
    return 0;
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  size_t len = strlen (val);
  if (TEMP_FAILURE_RETRY (write (fd, val, len)) != (ssize_t) len)
    return err_make_sys (err, errno, "write `%s` to `%s`", val, path);
  return 0;
}

/* Writes `val` to <root>/<id>/<knob>. */
static int
write_limit (const char *root, const char *id, const char *knob, const char *val, err_t *err)
{
  char path[SBX_CG_PATH_MAX];
  if (sbx_cg_path (path, sizeof path, root, id, NULL, knob, err) < 0)
    return -1;
  return sbx_cg_write_file (path, val, err);
}

/* Makes the sandbox's group in every hierarchy (the memory one by taking
 * spare group `spare` where that works). */
static int
make_groups (const sbx_cg_layout_t *l, const char *id, const char *spare, err_t *err)
{
  char path[SBX_CG_PATH_MAX], from[SBX_CG_PATH_MAX];
  for (size_t i = 0; i < l->n; i++)
    {
      if (sbx_cg_path (path, sizeof path, l->roots[i], id, NULL, NULL, err) < 0)
        return -1;
      if (spare != NULL && (int) i == l->memory && sbx_cg_spares_possible (l)
          && sbx_cg_path (from, sizeof from, l->roots[i], spare, NULL, NULL, NULL) >= 0 && rename (from, path) == 0)
        continue;
      if (mkdir (path, 0755) < 0)
        return err_make_sys (err, errno, "mkdir `%s`", path);
    }
  return 0;
}

static int
set_memory (const sbx_cg_layout_t *l, const char *id, long memory_mb, err_t *err)
{
  char val[64];
  snprintf (val, sizeof val, "%lld", (long long) memory_mb * 1024 * 1024);
  const char *root = l->roots[l->memory];
  /* v1 keeps the limit at or below memsw's: a spare group that was a
   * sandbox's with a smaller limit needs memsw raised first (a fresh
   * group refuses that until its limit is set: the write after does it). */
  if (!l->v2)
    write_limit (root, id, "memory.memsw.limit_in_bytes", val, NULL);
  if (write_limit (root, id, l->v2 ? "memory.max" : "memory.limit_in_bytes", val, err) < 0)
    return -1;
  /* cgroup v1 does not charge socket buffers to the memory limit unless
   * its TCP kernel-memory limit is set (v2 always does). */
  if (!l->v2 && write_knob (root, id, "memory.kmem.tcp.limit_in_bytes", val, err) < 0)
    return -1;
  /* No swap beyond the limit, where the kernel offers the knob. */
  write_limit (root, id, l->v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes", l->v2 ? "0" : val, NULL);
  return 0;
}

static int
set_cpu (const sbx_cg_layout_t *l, const char *id, long cpu_millis, err_t *err)
{
  long period = 100000, quota = cpu_millis * 100;
  const char *root = l->roots[l->cpu];
  char val[64];
  if (l->v2)
    {
      snprintf (val, sizeof val, "%ld %ld", quota, period);
      return write_limit (root, id, "cpu.max", val, err);
    }
  snprintf (val, sizeof val, "%ld", period);
  if (write_limit (root, id, "cpu.cfs_period_us", val, err) < 0)
    return -1;
  snprintf (val, sizeof val, "%ld", quota);
  return write_limit (root, id, "cpu.cfs_quota_us", val, err);
}

int
sbx_cg_create (const sbx_cg_layout_t *l, const char *id, const char *spare, const sbx_cg_limits_t *lim, err_t *err)
{
  if (make_groups (l, id, spare, err) < 0)
    return -1;
  /* pids: the tracking hierarchy (index 0) has the pids controller. */
  char val[64];
  if (lim->pids_max > 0)
    snprintf (val, sizeof val, "%ld", lim->pids_max);
  else
    snprintf (val, sizeof val, "max");
  if (write_limit (l->roots[0], id, "pids.max", val, err) < 0)
    return -1;
  if (l->memory >= 0 && lim->memory_mb > 0 && set_memory (l, id, lim->memory_mb, err) < 0)
    return -1;
  if (l->cpu >= 0 && lim->cpu_millis > 0 && set_cpu (l, id, lim->cpu_millis, err) < 0)
    return -1;
  return 0;
}

/* Memory of an existing group from `from_mb` to `to_mb`. On v1 the
 * limit may never exceed memsw's, so a raise writes memsw first and a cut
 * writes it last; a cut below what the group holds fails (EBUSY). */
static int
update_memory (const sbx_cg_layout_t *l, const char *id, long from_mb, long to_mb, err_t *err)
{
  if (l->v2)
    return set_memory (l, id, to_mb, err);
  char val[64];
  snprintf (val, sizeof val, "%lld", (long long) to_mb * 1024 * 1024);
  const char *root = l->roots[l->memory];
  bool raise = to_mb > from_mb;
  if ((raise && write_knob (root, id, "memory.memsw.limit_in_bytes", val, err) < 0)
      || write_limit (root, id, "memory.limit_in_bytes", val, err) < 0
      || (!raise && write_knob (root, id, "memory.memsw.limit_in_bytes", val, err) < 0))
    return -1;
  return write_knob (root, id, "memory.kmem.tcp.limit_in_bytes", val, err);
}

int
sbx_cg_update (const sbx_cg_layout_t *l, const char *id, const sbx_cg_limits_t *from, const sbx_cg_limits_t *to,
               err_t *err)
{
  char val[64];
  if (to->pids_max != from->pids_max)
    {
      if (to->pids_max > 0)
        snprintf (val, sizeof val, "%ld", to->pids_max);
      else
        snprintf (val, sizeof val, "max");
      if (write_limit (l->roots[0], id, "pids.max", val, err) < 0)
        return -1;
    }
  if (to->memory_mb != from->memory_mb)
    {
      if (l->memory < 0 || to->memory_mb <= 0)
        return err_make (err, ENOTSUP, "cgroup of `%s`: no memory limit to change", id);
      if (update_memory (l, id, from->memory_mb, to->memory_mb, err) < 0)
        return -1;
    }
  if (to->cpu_millis != from->cpu_millis)
    {
      if (l->cpu < 0)
        return err_make (err, ENOTSUP, "cgroup of `%s`: no cpu hierarchy for a CPU limit", id);
      /* v1: the quota alone; the period is the 100 ms of every group of
       * ours (the kernel's default, and what set_cpu writes). */
      if (to->cpu_millis > 0 && l->v2)
        return set_cpu (l, id, to->cpu_millis, err);
      if (to->cpu_millis > 0)
        snprintf (val, sizeof val, "%ld", to->cpu_millis * 100);
      else
        snprintf (val, sizeof val, "%s", l->v2 ? "max" : "-1");
      return write_limit (l->roots[l->cpu], id, l->v2 ? "cpu.max" : "cpu.cfs_quota_us", val, err);
    }
  return 0;
}

int
sbx_cg_create_sub (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err)
{
  char path[SBX_CG_PATH_MAX];
  for (size_t i = 0; i < l->n; i++)
    if (sbx_cg_path (path, sizeof path, l->roots[i], id, sub, NULL, err) < 0 || sbx_cg_mkdir (path, err) < 0)
      return -1;
  return 0;
}

/* The file a process writes "0" to, to move itself. On v1 that is `tasks`:
 * moving the calling thread alone skips the kernel's global threadgroup
 * lock (an RCU grace period per move through cgroup.procs), and our movers
 * are single-threaded, so the thread is the whole process. */
static const char *
join_file (const sbx_cg_layout_t *l)
{
  return l->v2 ? "cgroup.procs" : "tasks";
}

int
sbx_cg_open_track (const sbx_cg_layout_t *l, const char *id, const char *sub, int *fd, err_t *err)
{
  char path[SBX_CG_PATH_MAX];
  if (sbx_cg_path (path, sizeof path, l->roots[0], id, sub, NULL, err) < 0 || sbx_cg_mkdir (path, err) < 0)
    return -1;
  if (sbx_cg_path (path, sizeof path, l->roots[0], id, sub, join_file (l), err) < 0)
    return -1;
  *fd = open (path, O_WRONLY | O_CLOEXEC);
  if (*fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  return 0;
}

int
sbx_cg_attach (const sbx_cg_layout_t *l, const char *id, pid_t pid, err_t *err)
{
  char path[SBX_CG_PATH_MAX], val[24];
  snprintf (val, sizeof val, "%d", (int) pid);
  for (size_t i = 0; i < l->n; i++)
    {
      if (sbx_cg_path (path, sizeof path, l->roots[i], id, NULL, "cgroup.procs", err) < 0)
        return -1;
      /* A sandbox without a CPU limit has no group in the v1 cpu hierarchy. */
      if (!l->v2 && (int) i == l->cpu && access (path, F_OK) < 0 && errno == ENOENT)
        continue;
      if (sbx_cg_write_file (path, val, err) < 0)
        return -1;
    }
  return 0;
}

int
sbx_cg_join (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err)
{
  char path[SBX_CG_PATH_MAX];
  for (size_t i = 0; i < l->n; i++)
    if (sbx_cg_path (path, sizeof path, l->roots[i], id, sub, join_file (l), err) < 0
        || sbx_cg_write_file (path, "0", err) < 0)
      return -1;
  return 0;
}

char **
sbx_cg_list (const sbx_cg_layout_t *l)
{
  size_t n = 0, cap = 8;
  char **ids = calloc (cap + 1, sizeof *ids);
  if (ids == NULL)
    return NULL;
  for (size_t i = 0; i < l->n; i++)
    {
      DIR *d = opendir (l->roots[i]);
      if (d == NULL)
        continue;
      struct dirent *e;
      while ((e = readdir (d)) != NULL)
        {
          if (e->d_type != DT_DIR || e->d_name[0] == '.')
            continue;
          bool dup = false;
          for (size_t j = 0; j < n && !dup; j++)
            dup = strcmp (ids[j], e->d_name) == 0;
          if (dup)
            continue;
          if (n == cap)
            {
              char **grown = realloc (ids, (cap * 2 + 1) * sizeof *ids);
              if (grown == NULL)
                break;
              ids = grown;
              cap *= 2;
            }
          ids[n++] = strdup (e->d_name);
          ids[n] = NULL;
        }
      closedir (d);
    }
  ids[n] = NULL;
  return ids;
}
