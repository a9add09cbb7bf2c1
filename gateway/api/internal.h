/* api/internal: what the api layer's files share — the handlers of each
 * group, request receipt, and proto <-> runtime conversion (convert.c).
 * Handlers take the service's context and run after authentication. */
#ifndef SBX_GATEWAY_API_INTERNAL_H
#define SBX_GATEWAY_API_INTERNAL_H

#include "gateway/api/api.h"
#include "gateway/api/fields.h"
#include "gateway/runtime/runtime.h"
#include "gateway/snapshot/export.h"
#include "gateway/snapshot/session.h"
#include "sandbox/v1/sandbox.pb-c.h"

typedef int (*api_handler_fn) (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* sandbox.c */
int api_launch (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_get (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_extend (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_delete (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_list (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* bulk.c: the CPU priority (nice value) of a thread answering a call that
 * reads every sandbox, while it does (see bulk.c). Use as
 * `cleanup_bulk api_bulk_t b; api_bulk_enter (&b);`. */
#define API_BULK_NICE 10
typedef struct api_bulk_s
{
  int prev;
  bool lowered;
} api_bulk_t;
void api_bulk_enter (api_bulk_t *b);
void api_bulk_leave (api_bulk_t *b);
#define cleanup_bulk __attribute__ ((cleanup (api_bulk_leave)))
int api_exec (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_status (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* snapshot.c: what stops an export streaming for `call`: a deleted
 * sandbox or a freeze held too long cancels the call; the client's going
 * (or its deadline) stops the export. */
snap_canceller_t api_call_canceller (rpc_call_t *call);

/* template.c */
int api_create_template (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_list_templates (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_delete_template (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* image.c */
int api_pull_image (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_list_images (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_remove_image (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
/* Launches `id` on image `ref`, pulled first when it is not cached. */
int api_launch_on_image (rpc_call_t *call, const api_ctx_t *ctx, const char *id, const sbx_spec_t *spec,
                         const char *ref, sbx_info_t *info, err_t *err);
/* The same with the writable layer unpacked from `src` (a Restore). */
int api_restore_on_image (rpc_call_t *call, const api_ctx_t *ctx, const char *id, const sbx_spec_t *spec,
                          const char *ref, sbx_source_fn src, void *src_ctx, sbx_info_t *info, err_t *err);
/* The ids a file call in sandbox `id` acts as: its image's User (*as_user
 * false: the sandbox's root). */
int api_image_user (const api_ctx_t *ctx, const char *id, bool *as_user, uint32_t *uid, uint32_t *gid, err_t *err);
/* Restores `id` from `src` on the image a stored snapshot was taken on
 * (`ref`, pinned to `digest`: the cached image, else pulled by digest). */
int api_restore_recorded (rpc_call_t *call, const api_ctx_t *ctx, const char *id, bool egress, const char *ref,
                          const char *digest, sbx_source_fn src, void *src_ctx, sbx_info_t *info, err_t *err);
/* For a command in sandbox `id`: its image's Env merged under `env`
 * (*env_out, NULL when the sandbox has no image: use env as it is), its
 * WorkingDir (*cwd_out, NULL: none), both freed by the caller
 * (img_env_free, free), and its User (user_out's as_user, uid, gid; only
 * those fields are written). */
int api_image_defaults (const api_ctx_t *ctx, const char *id, char *const *env, char ***env_out, char **cwd_out,
                        sbx_exec_req_t *user_out, err_t *err);

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

/* code.c */
int api_create_context (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_list_contexts (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_restart_context (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_delete_context (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);
int api_run_code (rpc_call_t *call, const api_ctx_t *ctx, err_t *err);

/* files.c, shared with files_list.c: the file operation's cleanup, the
 * call's "gone" test, a request received whole with its strings checked
 * for NUL bytes, the path of a request (its `path_bytes` twin when set,
 * copied NUL-terminated into `buf` of SBX_FILE_PATH_MAX bytes; NULL with
 * *err for a NUL byte or a path too long), and a FileInfo from an INFO
 * answer (pointing into `path`, `target` and `names`: api_names_free). */
void api_cleanup_file_fn (sbx_file_t **f);
#define cleanup_file __attribute__ ((cleanup (api_cleanup_file_fn)))
bool api_call_gone (void *ctx);
/* sbx_file_start for a call: the operation acts as the sandbox's image
 * User (api_image_user), the call's going polled. */
int api_file_start (const api_ctx_t *ctx, const sbx_file_req_t *req, rpc_call_t *call, sbx_file_t **out, err_t *err);
int api_recv_checked (rpc_call_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, err_t *err);
const char *api_request_path (const char *text, ProtobufCBinaryData bytes, char *buf, err_t *err);
typedef struct api_names_s
{
  char *owned[3];
} api_names_t;
void api_names_free (api_names_t *n);
#define cleanup_names __attribute__ ((cleanup (api_names_free)))
int api_file_info_to_proto (const sbx_file_wire_t *in, const char *path, const char *target,
                            Sandbox__V1__FileInfo *out, api_names_t *names, err_t *err);
/* The runtime's file type (SBX_FTYPE_*) and watch event kind (SBX_EVENT_*)
 * as the proto's enums; anything else is FILE_TYPE_OTHER and
 * KIND_UNSPECIFIED. */
Sandbox__V1__FileType api_file_type_to_proto (uint32_t t);
Sandbox__V1__FileEvent__Kind api_event_kind_to_proto (uint32_t k);

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
/* Sends a message whose only field is `field` (length-delimited, an
 * API_FIELD_* constant of fields.h) holding
 * `data`, without packing it: `lent` data (an exec's output buffer) goes
 * to gRPC as is and is kept until sent (sbx_exec_hold); else it is copied
 * once, into the message. */
int api_send_bytes_field (rpc_call_t *call, uint32_t field, const uint8_t *data, size_t len, bool lent, err_t *err);
/* The same for lent data, without waiting until the transport has it
 * (rpc_call_send_raw_start: see rpc_call_send_wait_for). */
int api_send_bytes_field_start (rpc_call_t *call, uint32_t field, const uint8_t *data, size_t len, err_t *err);
void api_exit_to_proto (const sbx_exec_result_t *in, Sandbox__V1__ExitStatus *out);
/* Names a sandbox or a client chose, for proto3 `string` fields (which
 * must hold valid UTF-8; see FileInfo in the proto): api_utf8_valid tells
 * whether n bytes are strict UTF-8. api_utf8_text gives `s` itself when it
 * is valid (*raw empty, *owned NULL), else a copy with every byte that is
 * not part of a valid sequence replaced by U+FFFD (*owned: free it) and
 * *raw pointing at the exact bytes of `s`. NULL when out of memory. */
bool api_utf8_valid (const char *s, size_t n);
const char *api_utf8_text (const char *s, ProtobufCBinaryData *raw, char **owned);
/* A ProcessInfo's argv: `argv` itself when every element is valid UTF-8,
 * else made-valid copies and `argv_bytes` the exact elements (pointing
 * into `argv`); api_argv_free frees what was made. */
int api_argv_to_proto (char *const *argv, size_t n, Sandbox__V1__ProcessInfo *out, err_t *err);
void api_argv_free (Sandbox__V1__ProcessInfo *out);
int api_compression_from_proto (Sandbox__V1__Compression c, snap_compression_t *out, err_t *err);
/* A request's env map as "KEY=VALUE" strings (NULL-terminated; free each
 * and the array with api_env_free). EINVAL for a bad name. */
int api_env_from_proto (Sandbox__V1__ExecRequest__EnvEntry **entries, size_t n, char ***out, err_t *err);
int api_env_from_start (Sandbox__V1__ProcessStart__EnvEntry **entries, size_t n, char ***out, err_t *err);
int api_env_from_context (Sandbox__V1__CreateContextRequest__EnvEntry **entries, size_t n, char ***out, err_t *err);
int api_env_from_launch (Sandbox__V1__LaunchRequest__EnvEntry **entries, size_t n, char ***out, err_t *err);

/* spec.c */
/* A launch's spec and the strings it points to (owned). */
typedef struct api_spec_s
{
  sbx_spec_t spec;
  char **env, **labels;
} api_spec_t;
/* LaunchRequest's allow_egress, resources, env and labels (label syntax
 * and count checked here; resources and env caps by the runtime). EINVAL
 * naming the field. Release with api_spec_release (also after a failure). */
int api_spec_from_launch (const Sandbox__V1__LaunchRequest *req, api_spec_t *out, err_t *err);
void api_spec_release (api_spec_t *s);
void api_resources_to_proto (const sbx_resources_t *in, Sandbox__V1__Resources *out);
/* A SandboxInfo's labels map, made from "key=value" strings (which it
 * points into: they must outlive it). */
typedef struct api_labels_pb_s
{
  Sandbox__V1__SandboxInfo__LabelsEntry *entries;
  Sandbox__V1__SandboxInfo__LabelsEntry **ptrs;
  char **keys;
  size_t n;
} api_labels_pb_t;
int api_labels_to_proto (char *const *labels, api_labels_pb_t *out, Sandbox__V1__SandboxInfo *info, err_t *err);
void api_labels_pb_release (api_labels_pb_t *p);
/* Replies with a SandboxInfo, its resources and `labels` (may be NULL). */
int api_reply_info_labeled (rpc_call_t *call, const sbx_info_t *info, char *const *labels, err_t *err);
/* sbx_match_fn over a parsed selector (ctx: const lbl_selector_t *). */
bool api_selector_match (void *ctx, const char *const *labels);
void api_env_free (char **env);

#endif
