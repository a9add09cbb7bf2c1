/* routes: the REST contract, translated into sandbox.v1 gRPC calls — the
 * handlers of the route table (table.c) and what they share (common.c).
 *
 * The contract (status codes, JSON fields, content types, error shapes)
 * is the one agent backends already speak; the extensions (NDJSON exec,
 * snapshot, connect, list, metrics, detached processes, the WebSocket
 * terminal) are additive. Every handler runs on a worker (workers.h),
 * its connection suspended, and may block on the gateway; while it does,
 * the hang-up watcher (hangup.h) cancels the call if the client leaves. A
 * streamed answer whose reader blocks is made with shim_stream_response
 * (stream.h), so that its reads run on workers too; a reader that only
 * copies memory (the exec answer) may use MHD's own callback response.
 */
#ifndef SBX_SHIM_ROUTES_H
#define SBX_SHIM_ROUTES_H

#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/shim.h"

/* Deadline of short gateway calls (launch, delete, status...). */
#define ROUTE_SHORT_CALL_MS 60000
/* A launch on an image, which may pull it first. */
#define ROUTE_IMAGE_LAUNCH_MS (30 * 60 * 1000)
/* Deadline of each call of a fan-out over several gateways (GET
 * /sandboxes). */
#define ROUTE_FANOUT_CALL_MS 10000
/* Extra time an exec call gets over the command's own timeout. */
#define ROUTE_EXEC_MARGIN_MS 60000

/* sandboxes.c */
struct MHD_Response *route_health (shim_req_t *r, unsigned *status);
struct MHD_Response *route_launch (shim_req_t *r, unsigned *status);
struct MHD_Response *route_list (shim_req_t *r, unsigned *status);
struct MHD_Response *route_extend (shim_req_t *r, unsigned *status);
struct MHD_Response *route_delete (shim_req_t *r, unsigned *status);
/* GET /sandboxes/{id}: its entry in the GET /sandboxes shape (404 unknown). */
struct MHD_Response *route_get (shim_req_t *r, unsigned *status);
struct MHD_Response *route_metrics (shim_req_t *r, unsigned *status);

/* ready.c */
struct MHD_Response *route_ready (shim_req_t *r, unsigned *status);

/* exec.c */
struct MHD_Response *route_exec (shim_req_t *r, unsigned *status);

/* snapshots.c */
struct MHD_Response *route_restore (shim_req_t *r, unsigned *status);
int route_restore_upload (shim_req_t *r, const char *data, size_t len);
void route_restore_cleanup (shim_req_t *r);
struct MHD_Response *route_tar (shim_req_t *r, unsigned *status);
struct MHD_Response *route_snapshot (shim_req_t *r, unsigned *status);
struct MHD_Response *route_connect (shim_req_t *r, unsigned *status);
bool route_restore_missing (const char *id);

/* terminal.c */
struct MHD_Response *route_terminal (shim_req_t *r, unsigned *status);
void route_terminal_cleanup (shim_req_t *r);
/* processes.c */
struct MHD_Response *route_process_start (shim_req_t *r, unsigned *status);
struct MHD_Response *route_process_list (shim_req_t *r, unsigned *status);
struct MHD_Response *route_process_get (shim_req_t *r, unsigned *status);
struct MHD_Response *route_process_output (shim_req_t *r, unsigned *status);
struct MHD_Response *route_process_stdin (shim_req_t *r, unsigned *status);
struct MHD_Response *route_process_signal (shim_req_t *r, unsigned *status);
struct MHD_Response *route_process_resize (shim_req_t *r, unsigned *status);

/* files.c, files_data.c */
struct MHD_Response *route_file_get (shim_req_t *r, unsigned *status);
struct MHD_Response *route_file_put (shim_req_t *r, unsigned *status);
int route_file_put_upload (shim_req_t *r, const char *data, size_t len);
void route_file_put_cleanup (shim_req_t *r);
struct MHD_Response *route_file_stat (shim_req_t *r, unsigned *status);
struct MHD_Response *route_file_list (shim_req_t *r, unsigned *status);
struct MHD_Response *route_file_delete (shim_req_t *r, unsigned *status);
struct MHD_Response *route_file_rename (shim_req_t *r, unsigned *status);
struct MHD_Response *route_file_mkdir (shim_req_t *r, unsigned *status);
struct MHD_Response *route_file_watch (shim_req_t *r, unsigned *status);

/* ports.c (and proxy.c, through proxy.h) */
struct MHD_Response *route_ports_list (shim_req_t *r, unsigned *status);

/* templates.c */
struct MHD_Response *route_template_create (shim_req_t *r, unsigned *status);
struct MHD_Response *route_templates_list (shim_req_t *r, unsigned *status);
struct MHD_Response *route_template_delete (shim_req_t *r, unsigned *status);

/* images.c */
struct MHD_Response *route_images_list (shim_req_t *r, unsigned *status);
struct MHD_Response *route_image_pull (shim_req_t *r, unsigned *status);
struct MHD_Response *route_image_delete (shim_req_t *r, unsigned *status);
struct MHD_Response *route_port_link (shim_req_t *r, unsigned *status);
struct MHD_Response *route_port_root (shim_req_t *r, unsigned *status);
struct MHD_Response *proxy_handle (shim_req_t *r, unsigned *status);
int proxy_upload (shim_req_t *r, const char *data, size_t len);
void proxy_cleanup (shim_req_t *r);
void proxy_admit (shim_req_t *r);

/* code.c */
struct MHD_Response *route_code (shim_req_t *r, unsigned *status);
struct MHD_Response *route_context_create (shim_req_t *r, unsigned *status);
struct MHD_Response *route_context_list (shim_req_t *r, unsigned *status);
struct MHD_Response *route_context_delete (shim_req_t *r, unsigned *status);
struct MHD_Response *route_context_restart (shim_req_t *r, unsigned *status);

/* common.c */
/* A whole unary call with the shim's credentials to the gateway that owns
 * sandbox `id` (members.h). */
int route_unary (const char *id, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp, rpc_status_t *st,
                 int64_t timeout_ms);
/* The same, to the gateway of channel `ch` (calls about no sandbox in
 * particular: fan-out, health). */
int route_unary_on (rpc_channel_t *ch, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp, rpc_status_t *st,
                    int64_t timeout_ms);
/* Starts a call of `method` to the owner of sandbox `id`, with the shim's credentials, and sends `first`,
 * then the `n` messages of `rest`; with `half_close`, says that no more
 * follow. NULL with *st filled when that fails (UNAVAILABLE when the call
 * could not start, else the gateway's status). */
rpc_client_call_t *route_call_open (const char *id, const char *method, int64_t timeout_ms,
                                    const ProtobufCMessage *first, const ProtobufCMessage *const *rest, size_t n,
                                    bool half_close, rpc_status_t *st);
/* An output event as an NDJSON line's object: {"stdout_b64"} or
 * {"stderr_b64"}; counts the bytes in the metrics. */
json_t *route_output_json (bool stdout_, ProtobufCBinaryData d);
/* Base64 of `data` (caller frees), NULL when out of memory. */
char *route_base64 (const uint8_t *data, size_t len);
/* Reads the boolean query parameter `name` into *out (unchanged when
 * absent). NULL when fine; otherwise the 422 body (the caller owns it). */
json_t *route_query_bool (shim_req_t *r, const char *name, bool *out);

/* One message of a streaming call as an NDJSON event: a new JSON object
 * (the caller takes it), or NULL to send nothing for it. `ctx` is the one
 * given to route_ndjson. */
typedef json_t *(*route_event_fn) (const ProtobufCMessage *m, void *ctx);
/* The answer for a call that failed (shim_gateway_error or a variant). */
typedef struct MHD_Response *(*route_error_fn) (grpc_status_code code, const rpc_status_t *st, unsigned *status);
/* Answers with NDJSON (application/x-ndjson): one line per event of the
 * server-streaming call `c` (taken; `desc` its messages), sent as they
 * arrive, for as long as the call runs; the hang-up watcher cancels it if
 * the client leaves. The first message decides the status: a call that
 * fails before it is answered by `error`, not a 200; one that fails later
 * ends with an {"error", "detail"} line. `ctx` (taken; NULL or from
 * malloc, freed with free() with the answer) is the events' state. */
struct MHD_Response *route_ndjson (shim_req_t *r, rpc_client_call_t *c, const ProtobufCMessageDescriptor *desc,
                                   route_event_fn event, void *ctx, route_error_fn error, unsigned *status);

/* How every answer reports how a command ended (exec, process exit lines,
 * the terminal's exit message): `exit_code` is its exit status, or -N when
 * signal N ended it (as Python's subprocess reports it), or null when its
 * timeout killed it; `signal`, where an answer has it, is N or null. */
json_t *route_exit_code_json (const Sandbox__V1__ExitStatus *x);
json_t *route_exit_signal_json (const Sandbox__V1__ExitStatus *x);

#endif
