/* rpc_internal: helpers shared by rpc_server.c and rpc_client.c only. */
#ifndef SBX_COMMON_RPC_INTERNAL_H
#define SBX_COMMON_RPC_INTERNAL_H

#include "common/rpc/rpc.h"

/* Channel arguments built from rpc_opts_t: message limits and keepalive
 * (and, for clients, the TLS name override). Lives on the caller's stack
 * for the duration of the create call. */
typedef struct rpc_channel_args_s
{
  grpc_arg args[16];
  grpc_channel_args channel_args;
  size_t max_message;
} rpc_channel_args_t;

int rpc_channel_args_init (rpc_channel_args_t *a, const rpc_opts_t *opts, bool server);

/* Reads a whole PEM file (at most 1 MiB) into a NUL-terminated string that
 * the caller frees. */
int rpc_read_pem (const char *path, char **out, err_t *err);

/* Shuts down a pluck completion queue, drains it and destroys it. */
void rpc_cq_destroy (grpc_completion_queue *cq);

/* A monotonic deadline `ms` milliseconds from now; ms < 0 is in the past. */
gpr_timespec rpc_deadline_in_ms (int64_t ms);

#endif
