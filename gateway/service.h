/* service: the sandbox.v1.Sandbox service: authentication and dispatch.
 *
 * Every method is guarded by the bearer secret (CLOUD_RUN_SANDBOX_GATEWAY_
 * SECRET): with no secret configured every call fails UNAVAILABLE ("gateway
 * secret not configured"), fail closed; a missing or wrong token fails
 * UNAUTHENTICATED. Only then is the method's handler run.
 *
 * Threading: handlers run on the call layer's threads; the secret is set
 * once before the server starts.
 */
#ifndef SBX_GATEWAY_SERVICE_H
#define SBX_GATEWAY_SERVICE_H

#include "common/rpc.h"
#include "gateway/sbx_runtime.h"
#include "sandbox/v1/sandbox.pb-c.h"

/* Registers every sandbox.v1.Sandbox method on `server`. `secret` (may be
 * NULL or empty) and `rt` are borrowed for the program's lifetime. */
int service_register (rpc_server_t *server, const char *secret, sbx_runtime_t *rt, err_t *err);

/* Receives the single request message of a unary or server-streaming
 * call into *out (freed by the caller). EINVAL when there is none. */
int service_recv_request (rpc_call_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out,
                          err_t *err);

/* Fills `out` (pointing into `in`) from a runtime description. */
void service_info_to_proto (const sbx_info_t *in, Sandbox__V1__SandboxInfo *out);

/* After making sandbox `id` for `call`: when the call has meanwhile been
 * cancelled or passed its deadline, deletes the sandbox again and returns
 * -1 (ETIMEDOUT); 0 otherwise. */
int service_undo_if_gone (rpc_call_t *call, const char *id, err_t *err);

/* The full name of the service, as health and reflection report it. */
#define SERVICE_NAME "sandbox.v1.Sandbox"

#endif
