/* runtime/userns: the pool of host uid ranges — each live sandbox has one
 * of its own, SANDBOX_UID_RANGE ids from SANDBOX_UID_BASE + slot * RANGE,
 * and there are exactly SANDBOX_UID_SLOTS slots: the pool never hands out
 * an id outside the block BASE .. BASE + SLOTS * RANGE - 1 (the block this
 * gateway claims host-wide, uidblock.c). Free slots wait in a ring in the
 * order they were freed, so a range rests as long as the pool allows
 * before another sandbox gets it. Also the start-up check that this kernel
 * and the image's filesystem can give sandboxes user namespaces. The pool
 * is under rt->mu. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "gateway/runtime/internal.h"
#include "gateway/runtime/path.h"

/* How long the probe may take. */
#define PROBE_TIMEOUT_MS 30000

int
sbx_uid_pool_init (sbx_runtime_t *rt, err_t *err)
{
  if (!rt->cfg.userns)
    return 0;
  /* The configuration resolved the count and checked that the block ends
   * below the invalid uid (uid_t)-1. */
  if (rt->cfg.uid_slots <= 0 || rt->cfg.uid_slots < rt->cfg.max_sandboxes
      || rt->cfg.uid_base + rt->cfg.uid_slots * rt->cfg.uid_range - 1 > 4294967294L)
    return err_make (err, EINVAL,
                     "the uid pool (SANDBOX_UID_BASE, SANDBOX_UID_SLOTS, SANDBOX_UID_RANGE) is not valid");
  rt->uid_slots = (size_t) rt->cfg.uid_slots;
  rt->uid_free = calloc (rt->uid_slots, sizeof *rt->uid_free);
  if (rt->uid_free == NULL)
    return err_make (err, ENOMEM, "runtime: out of memory");
  for (size_t i = 0; i < rt->uid_slots; i++)
    rt->uid_free[i] = (long) i;
  rt->uid_head = 0;
  rt->uid_nfree = rt->uid_slots;
  return 0;
}

long
sbx_uid_take_locked (sbx_runtime_t *rt)
{
  if (rt->uid_nfree == 0)
    return -1;
  long slot = rt->uid_free[rt->uid_head];
  rt->uid_head = (rt->uid_head + 1) % rt->uid_slots;
  rt->uid_nfree--;
  return slot;
}

void
sbx_uid_release_locked (sbx_runtime_t *rt, long slot)
{
  /* Each slot is taken once and given back once (its sandbox's record
   * forgets it): the ring, as long as the pool, never overflows. */
  if (slot < 0 || (size_t) slot >= rt->uid_slots || rt->uid_nfree == rt->uid_slots)
    return;
  rt->uid_free[(rt->uid_head + rt->uid_nfree) % rt->uid_slots] = slot;
  rt->uid_nfree++;
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
  if (sbx_path_fmt (state, sizeof state, err, "%s/probe", rt->cfg.state_dir) < 0)
    return err_wrap (err, "SANDBOX_STATE_DIR");
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
