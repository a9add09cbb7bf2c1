/* watchdog: bounds how slowly an HTTP client may send a request (see
 * watchdog.c for the rules). server.c reports each connection's stage.
 *
 * Threading: the report functions are called from connection threads; one
 * watchdog thread checks the connections four times a second.
 */
#ifndef SBX_SHIM_WATCHDOG_H
#define SBX_SHIM_WATCHDOG_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

typedef enum stage_e
{
  STAGE_HEAD,     /* waiting for the request head */
  STAGE_BODY,     /* receiving the body */
  STAGE_ANSWER,   /* the route answers: the client is not timed */
  STAGE_UPGRADED, /* the socket left HTTP (a WebSocket): never timed again */
} stage_t;

/* MHD_OPTION_NOTIFY_CONNECTION: tracks connections from start to close. */
void watchdog_notify_connection (void *cls, struct MHD_Connection *conn, void **socket_context,
                                 enum MHD_ConnectionNotificationCode code);
/* The connection entered `stage`; `streaming` for a streamed body. An
 * upgraded connection stays STAGE_UPGRADED until it closes. */
void watchdog_stage (struct MHD_Connection *conn, stage_t stage, bool streaming);
/* `n` more body bytes arrived. */
void watchdog_body (struct MHD_Connection *conn, size_t n);
/* True while the open connections are near SHIM_MAX_CONNECTIONS: answers
 * should then close their connection (see watchdog.c). */
bool watchdog_pressed (void);
/* Starts the watchdog thread. */
int watchdog_start (err_t *err);

#endif
