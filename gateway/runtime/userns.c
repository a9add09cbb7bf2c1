/* runtime/userns: the pool of host uid ranges — each live sandbox has one
 * of its own, SANDBOX_UID_RANGE ids from SANDBOX_UID_BASE + slot * RANGE —
 * and the start-up check that this kernel and the image's filesystem can
 * give sandboxes user namespaces. The pool is under rt->mu. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"

/* How long the probe may take. */
#define PROBE_TIMEOUT_MS 30000

int
sbx_uid_pool_init (sbx_runtime_t *rt, err_t *err)
{
  if (!rt->cfg.userns)
    return 0;
  /* As many ranges as fit below the invalid uid (uid_t)-1; the
   * configuration made sure SANDBOX_MAX of them do. */
  rt->uid_slots = (size_t) ((4294967295UL - (unsigned long) rt->cfg.uid_base) / (unsigned long) rt->cfg.uid_range);
  rt->uid_used = calloc (rt->uid_slots ? rt->uid_slots : 1, 1);
  if (rt->uid_used == NULL)
    return err_make (err, ENOMEM, "runtime: out of memory");
  return 0;
}

long
sbx_uid_take_locked (sbx_runtime_t *rt)
{
  for (size_t i = 0; i < rt->uid_slots; i++)
    {
      size_t slot = (rt->uid_cursor + i) % rt->uid_slots;
      if (!rt->uid_used[slot])
        {
          rt->uid_used[slot] = 1;
          rt->uid_cursor = (slot + 1) % rt->uid_slots;
          return (long) slot;
        }
    }
  return -1;
}

void
sbx_uid_release_locked (sbx_runtime_t *rt, long slot)
{
  if (slot >= 0 && (size_t) slot < rt->uid_slots)
    rt->uid_used[slot] = 0;
}

uint32_t
sbx_uid_base (const sbx_runtime_t *rt, long slot)
{
  return (uint32_t) (rt->cfg.uid_base + slot * rt->cfg.uid_range);
}

int
sbx_userns_probe (sbx_runtime_t *rt, err_t *err)
{
  if (!rt->cfg.userns)
    return 0;
  char state[PATH_MAX], base[24], range[24];
  snprintf (state, sizeof state, "%s/probe", rt->cfg.state_dir);
  snprintf (base, sizeof base, "%ld", rt->cfg.uid_base);
  snprintf (range, sizeof range, "%ld", rt->cfg.uid_range);
  const char *argv[8 + 2 * 64]
      = {"sandbox-helper", "probe", "--id", "probe", "--state", state, "--lower", rt->cfg.rootfs};
  size_t n = 8;
  const char *ids[] = {"--uid-base", base, "--uid-range", range};
  for (size_t i = 0; i < 4; i++)
    argv[n++] = ids[i];
  for (size_t i = 0; rt->cfg.volumes != NULL && rt->cfg.volumes[i] != NULL && n + 3 < sizeof argv / sizeof *argv; i++)
    {
      argv[n++] = "--volume";
      argv[n++] = rt->cfg.volumes[i];
    }
  argv[n] = NULL;
  sbx_report_t r;
  int got = 0;
  if (sbx_run_helper_once (rt, argv, true, PROBE_TIMEOUT_MS, &r, NULL, &got, err) < 0)
    return -1;
  if (got == 1 && r.type == SBX_REPORT_READY)
    return 0;
  return err_make (err, got == 1 && r.status != 0 ? r.status : EIO,
                   "sandboxes cannot have user namespaces here (%s); SANDBOX_USERNS=false runs them as host root "
                   "instead (round-1 isolation, not recommended)",
                   got == 1 ? r.text : "the check did not answer");
}
