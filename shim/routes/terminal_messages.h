/* routes/terminal_messages: the JSON text frames of a terminal WebSocket
 * (routes/terminal.c) — control messages from the client (resize, signal,
 * close_stdin) made into ProcessInput, and the exit and error messages to
 * it. Pure: no I/O, no state; any thread.
 */
#ifndef SBX_SHIM_ROUTES_TERMINAL_MESSAGES_H
#define SBX_SHIM_ROUTES_TERMINAL_MESSAGES_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sandbox/v1/sandbox.pb-c.h"

/* Fills `in` from the control message data[0..len): `{"type":"resize",
 * "rows":R,"cols":C}` (1..65535, into *size, which `in` then points to),
 * `{"type":"signal","signal":"SIGINT"|"int"|2}` (a kill(1) name with or
 * without SIG, or 1..64) or `{"type":"close_stdin"}`.
 * NULL when fine, else why not (static text). *doc: the parsed message
 * (may be NULL), which the caller releases (json_decref) once `in` is sent:
 * `in` may point into it. */
const char *terminal_control_of (const uint8_t *data, size_t len, Sandbox__V1__ProcessInput *in,
                                 Sandbox__V1__PtySize *size, json_t **doc);

/* `{"type":"exit","exit_code":…,"signal":…,"timed_out":…}` (the exit
 * convention of routes.h), malloc'd; NULL out of memory. */
char *terminal_exit_text (const Sandbox__V1__ExitStatus *x);

/* `{"type":"error","detail":why}`, malloc'd; NULL out of memory. */
char *terminal_error_text (const char *why);

#endif
