/* runtime/pool_shape: a claimed pooled sandbox given the resources its
 * launch asks for. Pooled sandboxes are made with the gateway's defaults;
 * a claim changes in place what differs — pids, memory and CPU limits of
 * its cgroups (sbx_cg_update), the size and inode cap of its disk (a
 * tmpfs reconfigured through the gateway's descriptor of it) — before
 * anything of the tenant's runs in it: nothing has been charged to it yet
 * but its own set-up, so a limit applies to everything the tenant does.
 *
 * Does not own the claim (pool.c) nor undo a failed change: the caller
 * destroys the sandbox, which is never given back to the pool.
 *
 * Threading: any gateway thread, on a sandbox linked but not ready (no
 * other call reads its limits yet). Only writes to cgroupfs and
 * fspick/fsconfig on a descriptor: no fork, no namespace entered. */
#include <errno.h>
#include <stdio.h>
#include <sys/mount.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/wire.h"

static sbx_cg_limits_t
limits_of (const sbx_resources_t *res)
{
  return (sbx_cg_limits_t){.pids_max = res->pids_max, .memory_mb = res->memory_mb, .cpu_millis = res->cpu_millis};
}

/* Sets the size and inode cap of disk `disk_fd` (a tmpfs's detached
 * mount) as the helper makes them; a size below what the disk holds is
 * refused by the kernel (EINVAL). */
static int
resize_disk (int disk_fd, long disk_mb, err_t *err)
{
  char size[32], inodes[32];
  snprintf (size, sizeof size, "%ldm", disk_mb);
  snprintf (inodes, sizeof inodes, "%ld", disk_mb * SBX_DISK_INODES_PER_MB);
  cleanup_close int fs = fspick (disk_fd, "", FSPICK_EMPTY_PATH | FSPICK_CLOEXEC);
  if (fs < 0 || fsconfig (fs, FSCONFIG_SET_STRING, "size", size, 0) < 0
      || fsconfig (fs, FSCONFIG_SET_STRING, "nr_inodes", inodes, 0) < 0
      || fsconfig (fs, FSCONFIG_CMD_RECONFIGURE, NULL, NULL, 0) < 0)
    return err_make_sys (err, errno, "resize the disk to %s (%s inodes)", size, inodes);
  return 0;
}

int
sbx_pool_shape (sbx_runtime_t *rt, sbx_t *s, const sbx_resources_t *res, err_t *err)
{
  sbx_cg_limits_t from = limits_of (&s->res), to = limits_of (res);
  int rc = sbx_cg_update (&rt->cg, s->id, &from, &to, err);
  if (rc == 0 && res->disk_mb != s->res.disk_mb)
    rc = resize_disk (s->disk_fd, res->disk_mb, err);
  if (rc < 0)
    {
      err->status = EIO; /* the gateway failed to build what was asked */
      return err_wrap (err, "claim a pooled sandbox as `%s`", s->id);
    }
  s->res = *res;
  return 0;
}
