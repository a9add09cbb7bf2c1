/* members: the gateways behind the shim, and which one owns each sandbox.
 *
 * One gateway (SHIM_GATEWAYS unset): SHIM_GATEWAY_TARGET owns every id and
 * is never probed; the shim behaves as with a single channel.
 *
 * Several (SHIM_GATEWAYS): a comma list of gRPC targets, or
 * "dns-srv:<name>", whose SRV records (a headless Service's named port:
 * one record per StatefulSet pod, naming its stable DNS name) are resolved
 * again every SHIM_GATEWAYS_REFRESH_SECONDS. A member's stable name is the
 * target as listed, or "<SRV target>:<port>". Every member is probed every
 * SHIM_GATEWAYS_HEALTH_SECONDS with the gRPC health check:
 *   - up:       SERVING;
 *   - draining: NOT_SERVING, and its sandbox calls are refused from its
 *               handler layer (UNAVAILABLE): it is shutting down and saving
 *               its sandboxes. It stays their owner (its refusals answer
 *               503) until it is gone, so no other gateway restores one of
 *               them from an older snapshot in the meantime;
 *   - down:     unreachable, or NOT_SERVING for another reason (its
 *               self-check fails): out of the set until a probe passes.
 * A member that has not answered a probe yet counts as down.
 *
 * The owner of an id is the member, among those listed and not down, with
 * the highest rendezvous weight hash(member name, id): adding or removing
 * one of N members moves about 1/N of the ids, and every shim with the same
 * view of the set picks the same owner. With every member down the
 * highest-weighted listed one is used (its calls fail: 502, as with a
 * single unreachable gateway); with none listed (no SRV answer yet) calls
 * go to a channel that fails at once (502).
 *
 * State: a table of members, appended under a mutex and never shrunk (a
 * member that leaves the SRV answer is marked unlisted; its channel lives
 * until members_stop, since calls in flight may use it), so routing walks
 * it without a lock: names and channels are immutable once published, the
 * rest are atomics. Threading: one prober thread per member, one resolver
 * thread for dns-srv; everything here may be called from any thread.
 */
#ifndef SBX_SHIM_MEMBERS_H
#define SBX_SHIM_MEMBERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/rpc/rpc.h"

typedef struct members_config_s
{
  const char *gateways;     /* SHIM_GATEWAYS, or NULL */
  const char *target;       /* SHIM_GATEWAY_TARGET (SHIM_GATEWAYS unset) */
  long refresh_seconds;     /* SRV re-resolution period */
  long health_seconds;      /* probe period */
  const rpc_opts_t *opts;   /* channel options (copied) */
  const rpc_metadata_t *md; /* credentials for the Status probe (borrowed for the program's lifetime) */
  size_t n_md;
} members_config_t;

/* Checks SHIM_GATEWAYS's syntax (at configuration time): NULL when fine,
 * else a static reason. */
const char *members_check_spec (const char *gateways);

/* Opens the channels and starts probing and resolving; waits (briefly) for
 * the first probe of every member, so that the first requests are routed
 * with a known set. */
int members_start (const members_config_t *cfg, err_t *err);

/* Stops the threads and closes every channel. */
void members_stop (void);

/* The channel of `id`'s owner (see above); never NULL. Counts the call. */
rpc_channel_t *members_route (const char *id);

/* The members that are listed and not down, at most `cap`: their channels
 * and names (valid until members_stop). For calls about no sandbox in
 * particular (fan-out, health). With a single gateway: that one, always. */
size_t members_serving (rpc_channel_t **chs, const char **names, size_t cap);

/* Most gateways in a set (distinct names ever seen). */
#define MEMBERS_MAX 256
#define MEMBERS_MAX_TEXT "256"

/* ---- the pure parts of routing (unit-tested) ---- */

typedef enum member_state_e
{
  MEMBER_DOWN = 0,
  MEMBER_UP = 1,
  MEMBER_DRAINING = 2,
} member_state_t;

/* The rendezvous weight of member name `member` for sandbox `id` (NULL:
 * ""): the owner of an id is the eligible member of highest weight. */
uint64_t members_weight (const char *member, const char *id);

/* The owner among n members (their weights for one id, whether each is
 * listed, their states): the listed member of highest weight that is not
 * down; with every listed one down, the highest listed (*failover false);
 * -1 when none is listed. *failover: the owner is not the highest listed. */
int members_choose (const uint64_t *weights, const bool *listed, const member_state_t *states, size_t n,
                    bool *failover);

/* The state a probe's answers make: no answer to the health check: down;
 * SERVING: up; NOT_SERVING while its sandbox calls are refused by its
 * handler layer (shutting down): draining; NOT_SERVING otherwise (its
 * self-check fails): down. */
member_state_t members_state_of_probe (bool answered, bool serving, bool refused_by_handler);

/* True when routing over several members (SHIM_GATEWAYS set). */
bool members_routing (void);

/* The Prometheus series about members (state, calls routed, failovers). */
void members_render_metrics (FILE *f);

#endif
