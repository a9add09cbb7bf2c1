/* runtime/cgroup: sandbox cgroups on v2 or v1 (see cgroup.h).
 * Only file operations on cgroupfs; no state. */
#include "gateway/runtime/cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"

static int
write_file (const char *path, const char *value, err_t *err)
{
  cleanup_close int fd = open (path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  size_t len = strlen (value);
  if (TEMP_FAILURE_RETRY (write (fd, value, len)) != (ssize_t) len)
    return err_make_sys (err, errno, "write `%s` to `%s`", value, path);
  return 0;
}

/* Reads up to cap-1 bytes of a small file; -1 when it cannot be read. */
static ssize_t
read_file (const char *path, char *buf, size_t cap)
{
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  ssize_t n = TEMP_FAILURE_RETRY (read (fd, buf, cap - 1));
  if (n < 0)
    return -1;
  buf[n] = '\0';
  return n;
}

/* The number after `key ` in "key value" lines, or 0. */
static long
parse_keyed (const char *buf, const char *key)
{
  size_t klen = strlen (key);
  for (const char *line = buf; line != NULL && *line != '\0';)
    {
      if (strncmp (line, key, klen) == 0 && line[klen] == ' ')
        return strtol (line + klen + 1, NULL, 10);
      line = strchr (line, '\n');
      if (line != NULL)
        line++;
    }
  return 0;
}

/* The number after `key ` in a "key value" lines file, or 0. */
static long
read_keyed (const char *path, const char *key)
{
  char buf[4096];
  if (read_file (path, buf, sizeof buf) < 0)
    return 0;
  return parse_keyed (buf, key);
}

/* The same from a file open: cgroup files are made anew when read from
 * offset 0. */
static long
pread_keyed (int fd, const char *key)
{
  char buf[4096];
  ssize_t n = TEMP_FAILURE_RETRY (pread (fd, buf, sizeof buf - 1, 0));
  if (n < 0)
    return 0;
  buf[n] = '\0';
  return parse_keyed (buf, key);
}

/* Appends `s` at out[at] as snprintf would (cut at cap, NUL-terminated)
 * and returns where the next part goes (the untruncated length). Paths
 * are made on every exec: this is a fraction of snprintf's cost. */
static size_t
put (char *out, size_t cap, size_t at, const char *s)
{
  size_t n = strlen (s);
  if (at < cap)
    {
      size_t k = n < cap - 1 - at ? n : cap - 1 - at;
      memcpy (out + at, s, k);
      out[at + k] = '\0';
    }
  return at + n;
}

/* root[/id][/sub][/file] */
static void
path_of (char *out, size_t cap, const char *root, const char *id, const char *sub, const char *file)
{
  const char *parts[3] = {id, sub, file};
  size_t at = put (out, cap, 0, root);
  for (size_t i = 0; i < 3; i++)
    if (parts[i] != NULL)
      at = put (out, cap, put (out, cap, at, "/"), parts[i]);
}

int
sbx_cg_detect (const char *mount, const char *group, bool cpu, sbx_cg_layout_t *out, err_t *err)
{
  if (group[0] == '\0' || strchr (group, '/') != NULL || strcmp (group, ".") == 0 || strcmp (group, "..") == 0)
    return err_make (err, EINVAL, "cgroup group `%s` is not a single path component", group);
  memset (out, 0, sizeof *out);
  out->freezer = out->memory = out->cpu = -1;
  char probe[256];
  snprintf (probe, sizeof probe, "%s/cgroup.controllers", mount);
  if (access (probe, F_OK) == 0)
    {
      out->v2 = true;
      snprintf (out->roots[0], sizeof out->roots[0], "%s/%s", mount, group);
      out->n = 1;
      out->freezer = out->memory = out->cpu = 0;
      return 0;
    }
  static const char *const names[] = {"pids", "memory", "cpu", "freezer"};
  for (size_t i = 0; i < 4; i++)
    {
      if (i == 2 && !cpu)
        continue;
      snprintf (probe, sizeof probe, "%s/%s/cgroup.procs", mount, names[i]);
      if (access (probe, F_OK) != 0)
        {
          if (i == 0)
            return err_make (err, ENOTSUP, "no cgroup v2 at `%s` and no v1 pids hierarchy", mount);
          continue;
        }
      snprintf (out->roots[out->n], sizeof out->roots[0], "%s/%s/%s", mount, names[i], group);
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

static int
mkdir_ok (const char *path, err_t *err)
{
  if (mkdir (path, 0755) < 0 && errno != EEXIST)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  return 0;
}

int
sbx_cg_prepare (const sbx_cg_layout_t *l, err_t *err)
{
  for (size_t i = 0; i < l->n; i++)
    if (mkdir_ok (l->roots[i], err) < 0)
      return -1;
  if (l->v2)
    {
      /* Delegate the controllers down to each sandbox's group. */
      char parent[256];
      snprintf (parent, sizeof parent, "%s", l->roots[0]);
      char *slash = strrchr (parent, '/');
      *slash = '\0';
      char path[300];
      snprintf (path, sizeof path, "%s/cgroup.subtree_control", parent);
      write_file (path, "+pids +memory +cpu", NULL); /* may already be on */
      snprintf (path, sizeof path, "%s/cgroup.subtree_control", l->roots[0]);
      if (write_file (path, "+pids +memory +cpu", err) < 0)
        return -1;
    }
  if (sbx_cg_holders_possible (l))
    {
      char path[300];
      path_of (path, sizeof path, l->roots[l->memory], SBX_CG_HOLDERS, NULL, NULL);
      if (mkdir_ok (path, err) < 0)
        return -1;
    }
  return 0;
}

/* Writes a knob the kernel may not offer: a missing one is fine, any
 * other failure is not. */
static int
write_knob (const char *root, const char *id, const char *knob, const char *val, err_t *err)
{
  char path[300];
  path_of (path, sizeof path, root, id, NULL, knob);
  if (access (path, F_OK) < 0)
    return 0;
  return write_file (path, val, err);
}

int
sbx_cg_create (const sbx_cg_layout_t *l, const char *id, const char *spare, const sbx_cg_limits_t *lim, err_t *err)
{
  char path[300], val[64];
  for (size_t i = 0; i < l->n; i++)
    {
      path_of (path, sizeof path, l->roots[i], id, NULL, NULL);
      if (spare != NULL && (int) i == l->memory && sbx_cg_spares_possible (l))
        {
          char from[300];
          path_of (from, sizeof from, l->roots[i], spare, NULL, NULL);
          if (rename (from, path) == 0)
            continue;
        }
      if (mkdir (path, 0755) < 0)
        return err_make_sys (err, errno, "mkdir `%s`", path);
    }
  /* pids: the tracking hierarchy (index 0) has the pids controller. */
  path_of (path, sizeof path, l->roots[0], id, NULL, "pids.max");
  if (lim->pids_max > 0)
    snprintf (val, sizeof val, "%ld", lim->pids_max);
  else
    snprintf (val, sizeof val, "max");
  if (write_file (path, val, err) < 0)
    return -1;
  if (l->memory >= 0 && lim->memory_mb > 0)
    {
      long long bytes = (long long) lim->memory_mb * 1024 * 1024;
      snprintf (val, sizeof val, "%lld", bytes);
      path_of (path, sizeof path, l->roots[l->memory], id, NULL, l->v2 ? "memory.max" : "memory.limit_in_bytes");
      if (write_file (path, val, err) < 0)
        return -1;
      /* cgroup v1 does not charge socket buffers to the memory limit
       * unless its TCP kernel-memory limit is set (v2 always does). */
      if (!l->v2 && write_knob (l->roots[l->memory], id, "memory.kmem.tcp.limit_in_bytes", val, err) < 0)
        return -1;
      /* No swap beyond the limit, where the kernel offers the knob. */
      path_of (path, sizeof path, l->roots[l->memory], id, NULL,
               l->v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes");
      write_file (path, l->v2 ? "0" : val, NULL);
    }
  if (l->cpu >= 0 && lim->cpu_millis > 0)
    {
      long period = 100000, quota = lim->cpu_millis * 100;
      if (l->v2)
        {
          snprintf (val, sizeof val, "%ld %ld", quota, period);
          path_of (path, sizeof path, l->roots[l->cpu], id, NULL, "cpu.max");
          if (write_file (path, val, err) < 0)
            return -1;
        }
      else
        {
          snprintf (val, sizeof val, "%ld", period);
          path_of (path, sizeof path, l->roots[l->cpu], id, NULL, "cpu.cfs_period_us");
          if (write_file (path, val, err) < 0)
            return -1;
          snprintf (val, sizeof val, "%ld", quota);
          path_of (path, sizeof path, l->roots[l->cpu], id, NULL, "cpu.cfs_quota_us");
          if (write_file (path, val, err) < 0)
            return -1;
        }
    }
  return 0;
}

int
sbx_cg_create_sub (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err)
{
  char path[300];
  for (size_t i = 0; i < l->n; i++)
    {
      path_of (path, sizeof path, l->roots[i], id, sub, NULL);
      if (mkdir_ok (path, err) < 0)
        return -1;
    }
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
  char path[300];
  path_of (path, sizeof path, l->roots[0], id, sub, NULL);
  if (mkdir (path, 0755) < 0 && errno != EEXIST)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  path_of (path, sizeof path, l->roots[0], id, sub, join_file (l));
  *fd = open (path, O_WRONLY | O_CLOEXEC);
  if (*fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  return 0;
}

int
sbx_cg_attach (const sbx_cg_layout_t *l, const char *id, pid_t pid, err_t *err)
{
  char path[300], val[24];
  snprintf (val, sizeof val, "%d", (int) pid);
  for (size_t i = 0; i < l->n; i++)
    {
      path_of (path, sizeof path, l->roots[i], id, NULL, "cgroup.procs");
      if (write_file (path, val, err) < 0)
        return -1;
    }
  return 0;
}

int
sbx_cg_join (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err)
{
  char path[300];
  for (size_t i = 0; i < l->n; i++)
    {
      path_of (path, sizeof path, l->roots[i], id, sub, join_file (l));
      if (write_file (path, "0", err) < 0)
        return -1;
    }
  return 0;
}

/* How long a freeze may take to settle, in 5 ms steps. */
#define FREEZE_WAIT_STEPS 400

static int
freeze_group (const sbx_cg_layout_t *l, const char *id, const char *sub, bool frozen, err_t *err)
{
  if (l->freezer < 0)
    return 0;
  char path[300];
  path_of (path, sizeof path, l->roots[l->freezer], id, sub, l->v2 ? "cgroup.freeze" : "freezer.state");
  const char *val = l->v2 ? (frozen ? "1" : "0") : (frozen ? "FROZEN" : "THAWED");
  if (write_file (path, val, err) < 0)
    return -1;
  if (!frozen)
    return 0;
  /* Freezing is asynchronous: wait (bounded) until every task is frozen —
   * v1 says FROZEN, v2 says "frozen 1" in cgroup.events. Never report a
   * freeze that has not happened: a snapshot read meanwhile would tear. */
  if (l->v2)
    path_of (path, sizeof path, l->roots[l->freezer], id, sub, "cgroup.events");
  char state[512];
  for (int i = 0; i < FREEZE_WAIT_STEPS; i++)
    {
      if (read_file (path, state, sizeof state) > 0
          && (l->v2 ? strstr (state, "frozen 1") != NULL : strncmp (state, "FROZEN", 6) == 0))
        return 0;
      /* v1 asks each task to freeze once. One that was running into a
       * vfork then sleeps (freezably) for its child, which froze first, and
       * stays FREEZING until asked again: ask again every 50 ms. */
      if (!l->v2 && i % 10 == 9 && write_file (path, "FROZEN", err) < 0)
        return -1;
      struct timespec ts = {0, 5000000};
      nanosleep (&ts, NULL);
    }
  return err_make (err, EBUSY, "the sandbox did not freeze within %d ms", FREEZE_WAIT_STEPS * 5);
}

int
sbx_cg_freeze (const sbx_cg_layout_t *l, const char *id, bool frozen, err_t *err)
{
  return freeze_group (l, id, NULL, frozen, err);
}

/* Sends SIGKILL to every pid listed in `procs`; returns how many. */
static int
kill_listed (const char *procs)
{
  FILE *f = fopen (procs, "re");
  if (f == NULL)
    return 0;
  int n = 0;
  long pid;
  while (fscanf (f, "%ld", &pid) == 1)
    if (pid > 0 && kill ((pid_t) pid, SIGKILL) == 0)
      n++;
  fclose (f);
  return n;
}

/* Kills in one group and, depth first, in all its sub-groups. */
static int
kill_tree (const char *dir)
{
  int n = 0;
  DIR *d = opendir (dir);
  if (d == NULL)
    return 0;
  struct dirent *e;
  char path[512];
  while ((e = readdir (d)) != NULL)
    if (e->d_type == DT_DIR && e->d_name[0] != '.')
      {
        snprintf (path, sizeof path, "%s/%s", dir, e->d_name);
        n += kill_tree (path);
      }
  closedir (d);
  snprintf (path, sizeof path, "%s/cgroup.procs", dir);
  return n + kill_listed (path);
}

int
sbx_cg_kill (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err)
{
  char dir[300];
  path_of (dir, sizeof dir, l->roots[0], id, sub, NULL);
  if (l->v2)
    {
      char kill_file[320];
      snprintf (kill_file, sizeof kill_file, "%s/cgroup.kill", dir);
      if (write_file (kill_file, "1", NULL) == 0)
        goto wait_empty;
    }
  freeze_group (l, id, sub, true, NULL);
  for (int round = 0; round < 100; round++)
    if (kill_tree (dir) == 0)
      break;
  freeze_group (l, id, sub, false, NULL);
wait_empty:
  /* Killed processes leave the group once reaped; wait for that (bounded). */
  for (int i = 0; i < 400; i++)
    {
      if (sbx_cg_count (l, id, sub) <= 0)
        return 0;
      kill_tree (dir);
      struct timespec ts = {0, 5000000};
      nanosleep (&ts, NULL);
    }
  return err_make (err, EBUSY, "processes of `%s` survive SIGKILL", dir);
}

static int
rmdir_tree (const char *dir)
{
  DIR *d = opendir (dir);
  if (d == NULL)
    return errno == ENOENT ? 0 : -1;
  struct dirent *e;
  char path[512];
  int rc = 0;
  while ((e = readdir (d)) != NULL)
    if (e->d_type == DT_DIR && e->d_name[0] != '.')
      {
        snprintf (path, sizeof path, "%s/%s", dir, e->d_name);
        if (rmdir_tree (path) < 0)
          rc = -1;
      }
  closedir (d);
  if (rmdir (dir) < 0 && errno != ENOENT)
    rc = -1;
  return rc;
}

int
sbx_cg_remove (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err)
{
  char dir[300];
  int rc = 0;
  for (size_t i = 0; i < l->n; i++)
    {
      path_of (dir, sizeof dir, l->roots[i], id, sub, NULL);
      if (rmdir_tree (dir) < 0)
        rc = err_make_sys (err, errno, "remove cgroup `%s`", dir);
    }
  return rc;
}

int
sbx_cg_move_all (const sbx_cg_layout_t *l, const char *id, const char *sub, const char *to, err_t *err)
{
  char from[300], dest[300];
  path_of (from, sizeof from, l->roots[0], id, sub, "cgroup.procs");
  for (int round = 0; round < 16; round++)
    {
      FILE *f = fopen (from, "re");
      if (f == NULL)
        return errno == ENOENT ? 0 : err_make_sys (err, errno, "open `%s`", from);
      long pid;
      int seen = 0, dfd = -1;
      while (fscanf (f, "%ld", &pid) == 1)
        {
          if (seen++ == 0)
            {
              path_of (dest, sizeof dest, l->roots[0], id, to, NULL);
              if (mkdir (dest, 0755) < 0 && errno != EEXIST)
                {
                  fclose (f);
                  return err_make_sys (err, errno, "mkdir `%s`", dest);
                }
              path_of (dest, sizeof dest, l->roots[0], id, to, "cgroup.procs");
              dfd = open (dest, O_WRONLY | O_CLOEXEC);
              if (dfd < 0)
                {
                  fclose (f);
                  return err_make_sys (err, errno, "open `%s`", dest);
                }
            }
          char val[24];
          int len = snprintf (val, sizeof val, "%ld", pid);
          /* A failure (ESRCH: it exited meanwhile) shows as a process
           * still listed in the next round. */
          if (write (dfd, val, (size_t) len) < 0)
            continue;
        }
      fclose (f);
      if (dfd >= 0)
        close (dfd);
      if (seen == 0)
        return 0;
    }
  return err_make (err, EBUSY, "processes keep appearing in `%s`", from);
}

long
sbx_cg_count (const sbx_cg_layout_t *l, const char *id, const char *sub)
{
  char path[300], buf[64];
  path_of (path, sizeof path, l->roots[0], id, sub, "pids.current");
  if (read_file (path, buf, sizeof buf) < 0)
    return -1;
  return strtol (buf, NULL, 10);
}

/* Adds `key` of `file` over a group and all its sub-groups: cgroup v1
 * counts some events only where they happened (e.g. an exec's group). A
 * cgroup directory's link count is 2 plus its sub-groups (kernfs keeps
 * it): a group without any (an exec's, or the sandbox's own in a
 * hierarchy the gateway makes no sub-groups in) is not listed. */
static long
sum_keyed_at (const char *dir, const char *file, const char *key, int depth, int fd, const char *sub, int sub_fd)
{
  char path[512];
  path_of (path, sizeof path, dir, NULL, NULL, file);
  long total = fd >= 0 ? pread_keyed (fd, key) : read_keyed (path, key);
  struct stat st;
  if (depth > 4 || (stat (dir, &st) == 0 && st.st_nlink <= 2))
    return total;
  DIR *d = opendir (dir);
  if (d == NULL)
    return total;
  struct dirent *e;
  while ((e = readdir (d)) != NULL)
    if (e->d_type == DT_DIR && e->d_name[0] != '.')
      {
        path_of (path, sizeof path, dir, e->d_name, NULL, NULL);
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
  char path[300];
  for (int k = 0; k < 2; k++)
    for (int g = 0; g < 2; g++)
      {
        c->fds[k][g] = -1;
        int h = k == 0 ? 0 : l->memory;
        /* Sub-groups are made in the tracking hierarchy only (a v1 memory
         * hierarchy has none to open; reading falls back to the path). */
        if (h < 0 || (g == 1 && h != 0))
          continue;
        path_of (path, sizeof path, l->roots[h], id, g == 1 ? sub : NULL, counter_file (l, k));
        c->fds[k][g] = open (path, O_RDONLY | O_CLOEXEC);
      }
}

void
sbx_cg_counters_read (const sbx_cg_layout_t *l, const char *id, const sbx_cg_counters_t *c, bool of_sub,
                      sbx_cg_events_t *out)
{
  long sums[2] = {0, 0};
  char dir[300];
  for (int k = 0; k < 2; k++)
    {
      int h = k == 0 ? 0 : l->memory;
      if (h < 0)
        continue;
      path_of (dir, sizeof dir, l->roots[h], id, of_sub ? c->sub : NULL, NULL);
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

bool
sbx_cg_spares_possible (const sbx_cg_layout_t *l)
{
  return !l->v2 && l->memory >= 0;
}

static void
spare_path (const sbx_cg_layout_t *l, unsigned n, char *path, size_t cap)
{
  char name[32];
  snprintf (name, sizeof name, SBX_CG_SPARE_PREFIX "%u", n);
  path_of (path, cap, l->roots[l->memory], name, NULL, NULL);
}

int
sbx_cg_spare_make (const sbx_cg_layout_t *l, unsigned n, err_t *err)
{
  char path[300];
  spare_path (l, n, path, sizeof path);
  if (mkdir (path, 0755) < 0)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  return 0;
}

void
sbx_cg_spare_remove (const sbx_cg_layout_t *l, unsigned n)
{
  char path[300];
  spare_path (l, n, path, sizeof path);
  rmdir (path);
}

int
sbx_cg_remove_to_spare (const sbx_cg_layout_t *l, const char *id, unsigned n, err_t *err)
{
  if (!sbx_cg_spares_possible (l))
    return sbx_cg_remove (l, id, NULL, err);
  char dir[300];
  int rc = 0;
  for (size_t i = 0; i < l->n; i++)
    {
      path_of (dir, sizeof dir, l->roots[i], id, NULL, NULL);
      if ((int) i != l->memory && rmdir_tree (dir) < 0)
        rc = err_make_sys (err, errno, "remove cgroup `%s`", dir);
    }
  char spare[300];
  spare_path (l, n, spare, sizeof spare);
  path_of (dir, sizeof dir, l->roots[l->memory], id, NULL, NULL);
  if (rc == 0 && rename (dir, spare) == 0)
    return 1;
  if (rmdir_tree (dir) < 0)
    rc = err_make_sys (err, errno, "remove cgroup `%s`", dir);
  return rc;
}

void
sbx_cg_spares_remove (const sbx_cg_layout_t *l)
{
  if (!sbx_cg_spares_possible (l))
    return;
  DIR *d = opendir (l->roots[l->memory]);
  if (d == NULL)
    return;
  struct dirent *e;
  while ((e = readdir (d)) != NULL)
    if (strncmp (e->d_name, SBX_CG_SPARE_PREFIX, strlen (SBX_CG_SPARE_PREFIX)) == 0
        || strcmp (e->d_name, SBX_CG_HOLDERS) == 0)
      unlinkat (dirfd (d), e->d_name, AT_REMOVEDIR); /* EBUSY: a holder lives on */
  closedir (d);
}

bool
sbx_cg_holders_possible (const sbx_cg_layout_t *l)
{
  return !l->v2 && l->memory >= 0;
}

int
sbx_cg_open_holder_moves (const sbx_cg_layout_t *l, const char *id, int *into_sandbox, int *into_holders, err_t *err)
{
  *into_sandbox = *into_holders = -1;
  if (!sbx_cg_holders_possible (l))
    return 0;
  char path[300];
  path_of (path, sizeof path, l->roots[l->memory], id, NULL, "tasks");
  cleanup_close int sandbox = open (path, O_WRONLY | O_CLOEXEC);
  if (sandbox < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  path_of (path, sizeof path, l->roots[l->memory], SBX_CG_HOLDERS, NULL, "tasks");
  *into_holders = open (path, O_WRONLY | O_CLOEXEC);
  if (*into_holders < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  *into_sandbox = take_fd (&sandbox);
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
