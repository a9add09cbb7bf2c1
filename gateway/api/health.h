/* health: the standard grpc.health.v1.Health service (Check and Watch).
 *
 * Knows the serving status of "" (the whole server) and of every service
 * named at init; any other name is unknown (Check: NOT_FOUND; Watch:
 * SERVICE_UNKNOWN). Watch streams the current status at once and every
 * change after it, until the client goes away or the server shuts down.
 *
 * Threading: the status table is guarded by a mutex; handlers run on the
 * call layer's threads.
 */
#ifndef SBX_GATEWAY_HEALTH_H
#define SBX_GATEWAY_HEALTH_H

#include <stdbool.h>

#include "common/rpc/rpc.h"

/* Registers Check and Watch on `server`. `services` is a NULL-terminated
 * list of service names (borrowed for the program's lifetime), all SERVING. */
int health_register (rpc_server_t *server, const char *const *services, err_t *err);

/* Registers Check alone on a second `server` (the plaintext health
 * listener), answering from the same table; health_register comes first. */
int health_register_check (rpc_server_t *server, err_t *err);

/* Marks every service NOT_SERVING and ends Watch streams (at shutdown). */
void health_shutdown (void);

/* The runtime's self-check: a failure (its text) turns every service
 * NOT_SERVING until a check passes again (NULL); changes are logged. */
void health_set_failing (const char *failure);

#endif
