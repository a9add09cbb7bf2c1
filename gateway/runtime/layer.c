/* runtime/layer: an image layer unpacked by `sandbox-helper unpack-layer`
 * (helper/layer.c), unprivileged in a user namespace whose root is the
 * SANDBOX_IMAGE_UID range, with sandbox-unpack's confinement. The gateway
 * only spawns it and reads its one report; every path and byte of the
 * layer is handled in the helper's confined child. Each unpack runs in a
 * cgroup of its own (".unpack-<n>": a dot, never a sandbox id) with
 * LAYER_UNPACK_MEMORY_MB and LAYER_UNPACK_PIDS, joined right after its
 * spawn, killed and removed when it ends: a hostile layer cannot make it
 * take the host's memory or fork without bound. Any thread. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/runtime/internal.h"

/* What one layer's unpacker may hold (it streams: it needs little). */
#define LAYER_UNPACK_MEMORY_MB 512
#define LAYER_UNPACK_PIDS 16

static atomic_uint unpack_seq;

int
sbx_unpack_layer (sbx_runtime_t *rt, int blob_fd, const char *dir, int timeout_ms, err_t *err)
{
  const sbx_config_t *c = &rt->cfg;
  char uid[24], max[24], max_mb[24];
  snprintf (uid, sizeof uid, "%ld", c->image_uid);
  snprintf (max, sizeof max, "%ld", c->snapshot_max_entries);
  snprintf (max_mb, sizeof max_mb, "%ld", c->image_layer_max_mb);
  if (chown (dir, (uid_t) c->image_uid, (gid_t) c->image_uid) < 0)
    return err_make_sys (err, errno, "chown the new layer `%s`", dir);
  const char *argv[]
      = {"sandbox-helper", "unpack-layer", "--id",          "layer", "--state",  dir,    "--layer-uid", uid,
         "--unpacker",     c->unpacker,    "--max-entries", max,     "--max-mb", max_mb, NULL};
  char group[32];
  snprintf (group, sizeof group, ".unpack-%u", atomic_fetch_add (&unpack_seq, 1));
  sbx_cg_limits_t lim = {.pids_max = LAYER_UNPACK_PIDS, .memory_mb = LAYER_UNPACK_MEMORY_MB};
  if (sbx_cg_create (&rt->cg, group, NULL, &lim, err) < 0)
    return err_wrap (err, "unpack a layer: its cgroup");
  cleanup_close int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
  cleanup_close int report_fd = -1;
  pid_t pid = -1;
  if (sbx_spawn_helper (rt, (char *const *) argv, blob_fd, null, STDERR_FILENO, false, &pid, &report_fd, err) < 0)
    {
      sbx_cg_remove (&rt->cg, group, NULL, NULL);
      return err_wrap (err, "unpack a layer");
    }
  sbx_report_t r;
  int got = sbx_cg_attach (&rt->cg, group, pid, err) < 0 ? -2 : sbx_read_report (report_fd, &r, timeout_ms, NULL, 0);
  if (got != 1)
    kill (pid, SIGKILL);
  sbx_reap (pid);
  cleanup_err err_t cerr = ERR_INIT;
  if (sbx_cg_kill (&rt->cg, group, NULL, &cerr) < 0 || sbx_cg_remove (&rt->cg, group, NULL, &cerr) < 0)
    err_warn_release (&cerr, "unpack a layer: its cgroup `%s` stays", group);
  if (got == -2)
    return err_wrap (err, "unpack a layer: into its cgroup");
  if (got < 0)
    return err_make (err, ETIMEDOUT, "unpacking a layer took longer than %d ms", timeout_ms);
  if (got == 0)
    return err_make (err, EIO, "the layer's unpacker ended without a report");
  if (r.type == SBX_REPORT_ERROR)
    return err_make (err, r.status != 0 ? r.status : EIO, "%s", r.text);
  return 0;
}

void
sbx_layer_remove (const char *path)
{
  sbx_remove_tree (path);
}
