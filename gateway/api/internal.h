/* api/internal: what the api layer's files share — the handlers of each
 * group, request receipt, and proto <-> runtime conversion (convert.c).
 * Handlers take the service's context and run after authentication. */
#ifndef SBX_GATEWAY_API_INTERNAL_H
#define SBX_GATEWAY_API_INTERNAL_H

#include "gateway/api/api.h"
#include "gateway/runtime/runtime.h"
#include "gateway/snapshot/export.h"
#include "sandbox/v1/sandbox.pb-c.h"

typedef int (*api_handler_fn) (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* sandbox.c */
int api_launch (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_get (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_delete (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_list (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_exec (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_status (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* process.c */
int api_run (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_list_processes (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_signal_process (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* files.c */
int api_read_file (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_write_file (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_list_dir (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_stat (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_remove (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_rename (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_make_dir (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_watch (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* snapshot.c */
int api_restore (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_export (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_persist (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_connect (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* ports.c */
int api_forward (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_list_ports (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* Receives the single request message of a unary or server-streaming
 * call into *out (freed by the caller: cleanup_message). EINVAL when there
 * is none. */
int api_recv_request (rpc_call_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, err_t *err);

/* After making sandbox `id` for `call`: when the call has meanwhile been
 * cancelled or passed its deadline, deletes the sandbox again and returns
 * -1 (ETIMEDOUT); 0 otherwise. */
int api_undo_if_gone (rpc_call_t *call, sbx_runtime_t *rt, const char *id, err_t *err);

/* convert.c */
/* Fills `out` (pointing into `in`) from a runtime description. */
void api_info_to_proto (const sbx_info_t *in, Sandbox__V1__SandboxInfo *out);
/* Replies to a unary call with a SandboxInfo. */
int api_reply_info (rpc_call_t *call, const sbx_info_t *info, err_t *err);
/* The exec result as an ExitStatus (pointing into `in`). */
/* Sends a message whose only field is `field` (length-delimited) holding
 * `data`, without packing it: `lent` data (an exec's output buffer) goes
 * to gRPC as is and is kept until sent (sbx_exec_hold); else it is copied
 * once, into the message. */
int api_send_bytes_field (rpc_call_t *call, uint32_t field, const uint8_t *data, size_t len, bool lent, err_t *err);
/* The same for lent data, without waiting until the transport has it
 * (rpc_call_send_raw_start: see rpc_call_send_wait_for). */
int api_send_bytes_field_start (rpc_call_t *call, uint32_t field, const uint8_t *data, size_t len, err_t *err);
/* The field header (tag and varint length) of a length-delimited field:
 * its size, at most 11 bytes. */
size_t api_field_header (uint8_t *head, uint32_t field, size_t len);
void api_exit_to_proto (const sbx_exec_result_t *in, Sandbox__V1__ExitStatus *out);
int api_compression_from_proto (Sandbox__V1__Compression c, snap_compression_t *out, err_t *err);
/* A request's env map as "KEY=VALUE" strings (NULL-terminated; free each
 * and the array with api_env_free). EINVAL for a bad name. */
int api_env_from_proto (Sandbox__V1__ExecRequest__EnvEntry **entries, size_t n, char ***out, err_t *err);
int api_env_from_start (Sandbox__V1__ProcessStart__EnvEntry **entries, size_t n, char ***out, err_t *err);
void api_env_free (char **env);

#endif
