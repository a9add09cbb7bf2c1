/* runtime/cgroup_kill: freezing a sandbox's groups, killing everything in
 * one, moving what an exec left running, removing groups, counting their
 * processes (see cgroup.h). Every wait is bounded by a named limit that
 * says so when it is reached. Only file operations on cgroupfs; no
 * state. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/cgroup.h"
#include "gateway/runtime/cgroup_internal.h"
#include "gateway/runtime/path.h"

/* The step of the bounded waits below. */
#define CG_WAIT_STEP_MS 5
/* How long a freeze may take to settle. */
#define CG_FREEZE_WAIT_MS 2000
/* How long killed processes may take to leave their group (be reaped). */
#define CG_KILL_WAIT_MS 2000
/* v1 asks each task to freeze once; one caught in a vfork is asked again
 * this often. */
#define CG_REFREEZE_MS 50
/* Rounds of killing a v1 group's listed processes while it is frozen. */
#define CG_KILL_ROUNDS 100
/* Rounds of moving a group's processes while a fork races it. */
#define CG_MOVE_ROUNDS 16

static void
wait_step (void)
{
  struct timespec ts = {0, CG_WAIT_STEP_MS * 1000000L};
  nanosleep (&ts, NULL);
}

/* Waits (bounded) until every task of the group at `path` is frozen:
 * freezing is asynchronous — v1 says FROZEN, v2 says "frozen 1" in
 * cgroup.events. Never report a freeze that has not happened: a snapshot
 * read meanwhile would tear. */
static int
await_frozen (const sbx_cg_layout_t *l, const char *path, err_t *err)
{
  char state[512];
  for (int waited = 0; waited < CG_FREEZE_WAIT_MS; waited += CG_WAIT_STEP_MS)
    {
      if (sbx_cg_read_file (path, state, sizeof state) > 0
          && (l->v2 ? strstr (state, "frozen 1") != NULL : strncmp (state, "FROZEN", 6) == 0))
        return 0;
      /* One that was running into a vfork then sleeps (freezably) for its
       * child, which froze first, and stays FREEZING until asked again. */
      if (!l->v2 && waited % CG_REFREEZE_MS == CG_REFREEZE_MS - CG_WAIT_STEP_MS
          && sbx_cg_write_file (path, "FROZEN", err) < 0)
        return -1;
      wait_step ();
    }
  return err_make (err, EBUSY, "`%s`: the sandbox did not freeze within CG_FREEZE_WAIT_MS (%d ms)", path,
                   CG_FREEZE_WAIT_MS);
}

static int
freeze_group (const sbx_cg_layout_t *l, const char *id, const char *sub, bool frozen, err_t *err)
{
  if (l->freezer < 0)
    return 0;
  char path[SBX_CG_PATH_MAX];
  const char *root = l->roots[l->freezer];
  if (sbx_cg_path (path, sizeof path, root, id, sub, l->v2 ? "cgroup.freeze" : "freezer.state", err) < 0)
    return -1;
  const char *val = l->v2 ? (frozen ? "1" : "0") : (frozen ? "FROZEN" : "THAWED");
  if (sbx_cg_write_file (path, val, err) < 0)
    return -1;
  if (!frozen)
    return 0;
  if (l->v2 && sbx_cg_path (path, sizeof path, root, id, sub, "cgroup.events", err) < 0)
    return -1;
  return await_frozen (l, path, err);
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

/* Kills in one group and, depth first, in its sub-groups (at most
 * SBX_CG_TREE_DEPTH levels). */
static int
kill_tree (const char *dir, int depth)
{
  int n = 0;
  DIR *d = opendir (dir);
  if (d == NULL)
    return 0;
  struct dirent *e;
  char path[SBX_CG_TREE_PATH_MAX];
  while ((e = readdir (d)) != NULL)
    if (depth < SBX_CG_TREE_DEPTH && e->d_type == DT_DIR && e->d_name[0] != '.'
        && sbx_path_fmt (path, sizeof path, NULL, "%s/%s", dir, e->d_name) >= 0)
      n += kill_tree (path, depth + 1);
  closedir (d);
  if (sbx_cg_path (path, sizeof path, dir, NULL, NULL, "cgroup.procs", NULL) < 0)
    return n;
  return n + kill_listed (path);
}

int
sbx_cg_kill (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err)
{
  char dir[SBX_CG_PATH_MAX], kill_file[SBX_CG_PATH_MAX];
  if (sbx_cg_path (dir, sizeof dir, l->roots[0], id, sub, NULL, err) < 0)
    return -1;
  if (!l->v2 || sbx_cg_path (kill_file, sizeof kill_file, dir, NULL, NULL, "cgroup.kill", err) < 0
      || sbx_cg_write_file (kill_file, "1", NULL) < 0)
    {
      freeze_group (l, id, sub, true, NULL);
      for (int round = 0; round < CG_KILL_ROUNDS; round++)
        if (kill_tree (dir, 0) == 0)
          break;
      freeze_group (l, id, sub, false, NULL);
    }
  /* Killed processes leave the group once reaped; wait for that (bounded). */
  for (int waited = 0; waited < CG_KILL_WAIT_MS; waited += CG_WAIT_STEP_MS)
    {
      if (sbx_cg_count (l, id, sub) <= 0)
        return 0;
      kill_tree (dir, 0);
      wait_step ();
    }
  return err_make (err, EBUSY, "processes of `%s` survive SIGKILL for CG_KILL_WAIT_MS (%d ms)", dir, CG_KILL_WAIT_MS);
}

int
sbx_cg_remove (const sbx_cg_layout_t *l, const char *id, const char *sub, err_t *err)
{
  char dir[SBX_CG_PATH_MAX];
  int rc = 0;
  for (size_t i = 0; i < l->n; i++)
    {
      if (sbx_cg_path (dir, sizeof dir, l->roots[i], id, sub, NULL, err) < 0)
        rc = -1;
      else if (sbx_cg_rmdir_tree (dir) < 0)
        rc = err_make_sys (err, errno, "remove cgroup `%s`", dir);
    }
  return rc;
}

/* Opens <id>/<to>'s cgroup.procs (made when missing) in the tracking
 * hierarchy: a descriptor, or -1 with *err. */
static int
open_move_target (const sbx_cg_layout_t *l, const char *id, const char *to, err_t *err)
{
  char dest[SBX_CG_PATH_MAX];
  if (sbx_cg_path (dest, sizeof dest, l->roots[0], id, to, NULL, err) < 0 || sbx_cg_mkdir (dest, err) < 0)
    return -1;
  if (sbx_cg_path (dest, sizeof dest, l->roots[0], id, to, "cgroup.procs", err) < 0)
    return -1;
  int fd = open (dest, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", dest);
  return fd;
}

/* One round of sbx_cg_move_all: how many processes `from` listed, or -1
 * with *err. */
static int
move_round (const sbx_cg_layout_t *l, const char *id, const char *from, const char *to, err_t *err)
{
  FILE *f = fopen (from, "re");
  if (f == NULL)
    return errno == ENOENT ? 0 : err_make_sys (err, errno, "open `%s`", from);
  long pid;
  int seen = 0;
  cleanup_close int dfd = -1;
  while (fscanf (f, "%ld", &pid) == 1)
    {
      if (seen++ == 0 && (dfd = open_move_target (l, id, to, err)) < 0)
        {
          fclose (f);
          return -1;
        }
      char val[24];
      int len = snprintf (val, sizeof val, "%ld", pid);
      /* A failure (ESRCH: it exited meanwhile) shows as a process still
       * listed in the next round. */
      (void) !write (dfd, val, (size_t) len);
    }
  fclose (f);
  return seen;
}

int
sbx_cg_move_all (const sbx_cg_layout_t *l, const char *id, const char *sub, const char *to, err_t *err)
{
  char from[SBX_CG_PATH_MAX];
  if (sbx_cg_path (from, sizeof from, l->roots[0], id, sub, "cgroup.procs", err) < 0)
    return -1;
  for (int round = 0; round < CG_MOVE_ROUNDS; round++)
    {
      int seen = move_round (l, id, from, to, err);
      if (seen <= 0)
        return seen;
    }
  return err_make (err, EBUSY, "processes keep appearing in `%s` (CG_MOVE_ROUNDS: %d rounds)", from, CG_MOVE_ROUNDS);
}

long
sbx_cg_count (const sbx_cg_layout_t *l, const char *id, const char *sub)
{
  char path[SBX_CG_PATH_MAX], buf[64];
  if (sbx_cg_path (path, sizeof path, l->roots[0], id, sub, "pids.current", NULL) < 0
      || sbx_cg_read_file (path, buf, sizeof buf) < 0)
    return -1;
  return strtol (buf, NULL, 10);
}
