/* routes/proxy: what the port routes (ports.c) and the HTTP reverse proxy
 * (proxy.c) share — the forwarded-connection limits and the preview-link
 * tokens. Threading: every function may be called from any thread. */
#ifndef SBX_SHIM_ROUTES_PROXY_H
#define SBX_SHIM_ROUTES_PROXY_H

#include <stdbool.h>
#include <stdint.h>

#include "shim/shim.h"

typedef enum ports_slot_e
{
  PORTS_SLOT_TAKEN,
  PORTS_SLOT_SANDBOX_FULL, /* SHIM_MAX_FORWARDS_PER_SANDBOX reached */
  PORTS_SLOT_ALL_FULL,     /* SHIM_MAX_FORWARDS reached */
  PORTS_SLOT_NO_MEMORY,
} ports_slot_t;

/* Takes a forwarded-connection slot for sandbox `id` (`link`: for
 * preview-link traffic, which may hold only part of each cap):
 * PORTS_SLOT_TAKEN, or why none was. Every slot taken is given back with
 * ports_slot_release (the same `link`). */
ports_slot_t ports_slot_take (const char *id, bool link);
void ports_slot_release (const char *id, bool link);

/* A preview link's token for `port` of sandbox `id` (created at
 * `created_ms`, as Get says), valid until `expires` (Unix seconds):
 * "<id>.<port>.<expires>.<created_ms>.<mac>" where mac is
 * base64url(HMAC-SHA256) under a key derived from the shim's secret. `out`
 * holds PORTS_TOKEN_MAX bytes. */
#define PORTS_TOKEN_MAX 200
int ports_token_make (const char *id, unsigned port, int64_t expires, int64_t created_ms, char *out);

/* Checks a token's form, expiry and MAC (its text up to the first '/' or
 * '?' of `text`) without asking the gateway: 0 with the sandbox in `id`
 * (SHIM_ID_MAX + 1 bytes), the port in *port and the creation time it was
 * made for in *created_ms; -1 when it is malformed, expired or forged. */
int ports_token_verify (const char *text, char *id, unsigned *port, int64_t *created_ms);

/* ports_token_verify, then (only for a genuine token) asks the gateway
 * whether the sandbox still exists with that creation time: -1 when it is
 * gone or was created again since. */
int ports_token_check (const char *text, char *id, unsigned *port);

/* The proxy's route handlers (proxy.c): `/sandboxes/{id}/ports/{port}/…`
 * (bearer) and `/p/<token>/…` (the token is the credential). */
struct MHD_Response *proxy_handle (shim_req_t *r, unsigned *status);
int proxy_upload (shim_req_t *r, const char *data, size_t len);
void proxy_cleanup (shim_req_t *r);
/* A preview link's token is checked (ports_token_verify, no gateway call)
 * before any of the body is read: 403 at once for a bad one. */
void proxy_admit (shim_req_t *r);

#endif
