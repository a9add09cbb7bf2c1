/* api: the sandbox.v1.Sandbox service — authentication and dispatch to the
 * handlers of each group of methods (sandbox.c, process.c, snapshot.c,
 * files.c).
 *
 * Every method is guarded by the bearer secret (CLOUD_RUN_SANDBOX_GATEWAY_
 * SECRET): with no secret configured every call fails UNAVAILABLE ("gateway
 * secret not configured"), fail closed; a missing or wrong token fails
 * UNAUTHENTICATED. Only then is the method's handler run, with the
 * service's context (no globals).
 *
 * Threading: handlers run on the call layer's threads; the context is
 * immutable once registered.
 */
#ifndef SBX_GATEWAY_API_H
#define SBX_GATEWAY_API_H

#include "common/rpc/rpc.h"
#include "gateway/runtime/runtime.h"
#include "gateway/store/store.h"

/* The full name of the service, as health and reflection report it. */
#define API_SERVICE_NAME "sandbox.v1.Sandbox"

/* What every handler works with; borrowed for the server's lifetime. */
typedef struct api_ctx_s
{
  const char *secret; /* may be NULL or empty: every call fails UNAVAILABLE */
  sbx_runtime_t *rt;
  snap_store_t *store;
  const char *gateway_name;   /* what Status reports; NULL: "" */
  struct img_cache_s *images; /* the image cache (gateway/image); NULL: no images */
} api_ctx_t;

typedef struct api_s api_t;

/* Registers every sandbox.v1.Sandbox method on `server`. `ctx` is copied;
 * its pointers are borrowed. Free *out after the server is destroyed. */
int api_register (rpc_server_t *server, const api_ctx_t *ctx, api_t **out, err_t *err);

void api_free (api_t *api);

#endif
