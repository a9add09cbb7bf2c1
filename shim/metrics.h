/* metrics: the shim's counters, exposed in the Prometheus text format.
 *
 * Requests by route and status, exec durations (a histogram), bytes
 * streamed in each direction, and gateway errors by gRPC status. Counters
 * are atomics updated from request threads; rendering reads them without
 * stopping anyone.
 */
#ifndef SBX_SHIM_METRICS_H
#define SBX_SHIM_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "common/rpc/rpc.h"

/* Counts a finished request: `route` is the route's template (e.g.
 * "/sandboxes/{id}/exec"), one of a fixed set. A `foreign` status (a
 * sandbox server's, through the port proxy) is counted by its class only
 * ("2xx"…"5xx", "other"): a server chooses it, and must not be able to
 * fill the series table. */
void metrics_request (const char *method, const char *route, unsigned status, bool foreign, double seconds);

void metrics_exec_duration (double seconds);
void metrics_bytes (bool upload, uint64_t n);
void metrics_gateway_error (grpc_status_code code);
/* A restore on miss: "restored", "absent" (no snapshot) or "failed". */
void metrics_restore_on_miss (const char *outcome);

/* Writes the text exposition of the counters above to `f`. */
void metrics_render (FILE *f);

#endif
