/* runtime/cgroup_spares: memory groups made ahead of launches and kept
 * after deletes, and the holders' memory group (cgroup v1 only; see
 * cgroup.h). Only file operations on cgroupfs; no state. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/cgroup.h"
#include "gateway/runtime/cgroup_internal.h"

bool
sbx_cg_spares_possible (const sbx_cg_layout_t *l)
{
  return !l->v2 && l->memory >= 0;
}

int
sbx_cg_spare_make (const sbx_cg_layout_t *l, unsigned n, err_t *err)
{
  char path[SBX_CG_PATH_MAX];
  if (sbx_cg_spare_path (l, n, path, sizeof path, err) < 0)
    return -1;
  if (mkdir (path, 0755) < 0)
    return err_make_sys (err, errno, "mkdir `%s`", path);
  return 0;
}

void
sbx_cg_spare_remove (const sbx_cg_layout_t *l, unsigned n)
{
  char path[SBX_CG_PATH_MAX];
  if (sbx_cg_spare_path (l, n, path, sizeof path, NULL) >= 0)
    rmdir (path);
}

int
sbx_cg_remove_to_spare (const sbx_cg_layout_t *l, const char *id, unsigned n, err_t *err)
{
  if (!sbx_cg_spares_possible (l))
    return sbx_cg_remove (l, id, NULL, err);
  char dir[SBX_CG_PATH_MAX];
  int rc = 0;
  for (size_t i = 0; i < l->n; i++)
    {
      if ((int) i == l->memory)
        continue;
      if (sbx_cg_path (dir, sizeof dir, l->roots[i], id, NULL, NULL, err) < 0)
        rc = -1;
      else if (sbx_cg_rmdir_tree (dir) < 0)
        rc = err_make_sys (err, errno, "remove cgroup `%s`", dir);
    }
  char spare[SBX_CG_PATH_MAX];
  if (sbx_cg_path (dir, sizeof dir, l->roots[l->memory], id, NULL, NULL, err) < 0)
    return -1;
  if (rc == 0 && sbx_cg_spare_path (l, n, spare, sizeof spare, NULL) >= 0 && rename (dir, spare) == 0)
    return 1;
  if (sbx_cg_rmdir_tree (dir) < 0)
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
  char path[SBX_CG_PATH_MAX];
  if (sbx_cg_path (path, sizeof path, l->roots[l->memory], id, NULL, "tasks", err) < 0)
    return -1;
  cleanup_close int sandbox = open (path, O_WRONLY | O_CLOEXEC);
  if (sandbox < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  if (sbx_cg_path (path, sizeof path, l->roots[l->memory], SBX_CG_HOLDERS, NULL, "tasks", err) < 0)
    return -1;
  *into_holders = open (path, O_WRONLY | O_CLOEXEC);
  if (*into_holders < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  *into_sandbox = take_fd (&sandbox);
  return 0;
}
