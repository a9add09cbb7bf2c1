/* target: the strict check of SHIM_GATEWAY_TARGET, the gateway's address.
 *
 * gRPC accepts almost any text as a target and only fails, over and over,
 * when it tries to connect; the shim refuses at start what cannot name a
 * gateway. Accepted forms (a port is always required, 1..65535):
 *   host:port               host a DNS name, an IPv4 address or [IPv6]
 *   dns:host:port, dns:///host:port, dns://authority/host:port
 *   ipv4:a.b.c.d:port[,...] and ipv6:[addr]:port[,...]
 *   unix:path, unix:///absolute/path, unix-abstract:name
 * Pure; no state.
 */
#ifndef SBX_SHIM_TARGET_H
#define SBX_SHIM_TARGET_H

#include <stdbool.h>

/* True when `target` is one of the forms above. */
bool shim_target_valid (const char *target);

#endif
