/* service: sandbox.v1.Sandbox method table and the auth guard in front of
 * it (see service.h). State: the secret, set once at registration. */
#include "gateway/service.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bearer.h"
#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/sbx_runtime.h"
#include "gateway/snap_rpc.h"
#include "sandbox/v1/sandbox.pb-c.h"

static const char *service_secret;
static sbx_runtime_t *service_rt;

/* A method of the service; `fn` runs only after authentication. */
typedef struct service_method_s
{
  const char *path;
  rpc_handler_fn fn;
} service_method_t;

int
service_recv_request (rpc_call_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, err_t *err)
{
  int rc = rpc_call_recv (call, desc, out, err);
  if (rc == 0)
    return err_make (err, EINVAL, "%s: no request message", rpc_call_method (call));
  return rc < 0 ? -1 : 0;
}

#define RECV(call, type, desc, var, err)                                                                           \
  ProtobufCMessage *var##_msg = NULL;                                                                              \
  if (service_recv_request (call, &desc, &var##_msg, err) < 0)                                                                 \
    return -1;                                                                                                     \
  type *var = (type *) var##_msg

void
service_info_to_proto (const sbx_info_t *in, Sandbox__V1__SandboxInfo *out)
{
  sandbox__v1__sandbox_info__init (out);
  out->sandbox_id = (char *) in->id;
  out->created_at_unix_ms = in->created_ms;
  out->last_used_unix_ms = in->last_used_ms;
  out->allow_egress = in->allow_egress;
  out->process_count = (uint32_t) in->process_count;
  out->disk_used_bytes = in->disk_used_bytes;
  out->disk_limit_bytes = in->disk_limit_bytes;
}

static int
reply_info (rpc_call_t *call, const sbx_info_t *info, err_t *err)
{
  Sandbox__V1__SandboxInfo pb;
  service_info_to_proto (info, &pb);
  return rpc_call_reply (call, &pb.base, err);
}

int
service_undo_if_gone (rpc_call_t *call, const char *id, err_t *err)
{
  if (!rpc_call_cancelled (call) && rpc_call_deadline_ms_left (call) > 0)
    return 0;
  /* Nobody will learn of this sandbox: it must not linger and count. */
  err_t derr = ERR_INIT;
  sbx_delete (service_rt, id, &derr);
  err_release (&derr);
  return err_make (err, ETIMEDOUT, "the call ended (deadline or cancellation) before `%s` was ready: undone", id);
}

static int
handle_launch (rpc_call_t *call, void *user, err_t *err)
{
  RECV (call, Sandbox__V1__LaunchRequest, sandbox__v1__launch_request__descriptor, req, err);
  sbx_info_t info;
  int rc = rpc_call_deadline_ms_left (call) <= 0 ? err_make (err, ETIMEDOUT, "deadline exceeded before the launch")
                                                 : sbx_launch (service_rt, req->sandbox_id, req->allow_egress, &info,
                                                               err);
  if (rc == 0)
    rc = service_undo_if_gone (call, req->sandbox_id, err);
  if (rc == 0)
    rc = reply_info (call, &info, err);
  protobuf_c_message_free_unpacked (req_msg, NULL);
  return rc;
}

static int
handle_get (rpc_call_t *call, void *user, err_t *err)
{
  RECV (call, Sandbox__V1__GetRequest, sandbox__v1__get_request__descriptor, req, err);
  sbx_info_t info;
  int rc = sbx_get (service_rt, req->sandbox_id, &info, err);
  if (rc == 0)
    rc = reply_info (call, &info, err);
  protobuf_c_message_free_unpacked (req_msg, NULL);
  return rc;
}

static int
handle_delete (rpc_call_t *call, void *user, err_t *err)
{
  RECV (call, Sandbox__V1__DeleteRequest, sandbox__v1__delete_request__descriptor, req, err);
  int rc = sbx_delete (service_rt, req->sandbox_id, err);
  bool snapshot_deleted = false;
  if (req->delete_snapshot && (rc == 0 || err->status == ENOENT))
    {
      /* The snapshot goes too; NOT_FOUND only when neither existed. */
      bool live = rc == 0;
      err_release (err);
      rc = snap_rpc_delete_snapshot (req->sandbox_id, &snapshot_deleted, err);
      if (rc == 0 && !live && !snapshot_deleted)
        rc = err_make (err, ENOENT, "sandbox `%s` not found, and no stored snapshot", req->sandbox_id);
    }
  if (rc == 0)
    {
      Sandbox__V1__DeleteResponse resp = SANDBOX__V1__DELETE_RESPONSE__INIT;
      resp.snapshot_deleted = snapshot_deleted;
      rc = rpc_call_reply (call, &resp.base, err);
    }
  protobuf_c_message_free_unpacked (req_msg, NULL);
  return rc;
}

static int
handle_list (rpc_call_t *call, void *user, err_t *err)
{
  RECV (call, Sandbox__V1__ListRequest, sandbox__v1__list_request__descriptor, req, err);
  protobuf_c_message_free_unpacked (req_msg, NULL);
  (void) req;
  cleanup_free sbx_info_t *infos = NULL;
  size_t n = 0;
  if (sbx_list (service_rt, &infos, &n, err) < 0)
    return -1;
  cleanup_free Sandbox__V1__SandboxInfo *pbs = calloc (n + 1, sizeof *pbs);
  cleanup_free Sandbox__V1__SandboxInfo **ptrs = calloc (n + 1, sizeof *ptrs);
  if (pbs == NULL || ptrs == NULL)
    return err_make (err, ENOMEM, "List: out of memory");
  for (size_t i = 0; i < n; i++)
    {
      service_info_to_proto (&infos[i], &pbs[i]);
      ptrs[i] = &pbs[i];
    }
  Sandbox__V1__ListResponse resp = SANDBOX__V1__LIST_RESPONSE__INIT;
  resp.n_sandboxes = n;
  resp.sandboxes = ptrs;
  return rpc_call_reply (call, &resp.base, err);
}

/* Exec's sink: output chunks become ExecEvents on the call. */
static int
exec_output (void *ctx, int stream, const uint8_t *data, size_t len)
{
  rpc_call_t *call = ctx;
  Sandbox__V1__ExecEvent ev = SANDBOX__V1__EXEC_EVENT__INIT;
  ProtobufCBinaryData bytes = {.len = len, .data = (uint8_t *) data};
  if (stream == 1)
    {
      ev.event_case = SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT;
      ev.stdout = bytes;
    }
  else
    {
      ev.event_case = SANDBOX__V1__EXEC_EVENT__EVENT_STDERR;
      ev.stderr = bytes;
    }
  err_t err = ERR_INIT;
  int rc = rpc_call_send (call, &ev.base, &err);
  err_release (&err);
  return rc;
}

static bool
exec_cancelled (void *ctx)
{
  rpc_call_t *call = ctx;
  /* At shutdown, calls still running after the grace period are cancelled,
   * which this sees too. */
  return rpc_call_cancelled (call);
}

static int
handle_exec (rpc_call_t *call, void *user, err_t *err)
{
  RECV (call, Sandbox__V1__ExecRequest, sandbox__v1__exec_request__descriptor, req, err);
  int rc = -1;
  cleanup_free char **argv = calloc (req->n_argv + 1, sizeof *argv);
  cleanup_free char **env = calloc (req->n_env + 1, sizeof *env);
  size_t n_env = 0;
  if (argv == NULL || env == NULL)
    {
      err_make (err, ENOMEM, "Exec: out of memory");
      goto out;
    }
  if (req->n_argv == 0)
    {
      err_make (err, EINVAL, "argv must have at least one element");
      goto out;
    }
  for (size_t i = 0; i < req->n_argv; i++)
    argv[i] = req->argv[i];
  for (size_t i = 0; i < req->n_env; i++)
    {
      const char *key = req->env[i]->key, *val = req->env[i]->value;
      if (key[0] == '\0' || strchr (key, '=') != NULL)
        {
          err_make (err, EINVAL, "env: `%s` is not a variable name", key);
          goto out;
        }
      if (asprintf (&env[n_env], "%s=%s", key, val) < 0)
        {
          err_make (err, ENOMEM, "Exec: out of memory");
          goto out;
        }
      n_env++;
    }
  sbx_exec_req_t xr = {
      .id = req->sandbox_id,
      .argv = argv,
      .env = env,
      .cwd = req->cwd,
      .stdin_data = req->stdin.data,
      .stdin_len = req->stdin.len,
      .timeout_seconds = req->timeout_seconds,
  };
  sbx_exec_sink_t sink = {.output = exec_output, .cancelled = exec_cancelled, .ctx = call};
  sbx_exec_result_t res;
  rc = sbx_exec (service_rt, &xr, &sink, &res, err);
  if (rc == 0 && !res.cancelled)
    {
      Sandbox__V1__ExitStatus st = SANDBOX__V1__EXIT_STATUS__INIT;
      st.exit_code = res.exit_code;
      st.signal = res.signal;
      st.timed_out = res.timed_out;
      st.duration_ms = res.duration_ms;
      st.oom_killed = res.oom_killed;
      st.message = res.message;
      Sandbox__V1__ExecEvent ev = SANDBOX__V1__EXEC_EVENT__INIT;
      ev.event_case = SANDBOX__V1__EXEC_EVENT__EVENT_EXIT;
      ev.exit = &st;
      rc = rpc_call_send (call, &ev.base, err);
    }
  else if (rc == 0)
    rc = err_make (err, ECANCELED, "exec cancelled: %s", res.message);
out:
  for (size_t i = 0; i < n_env; i++)
    free (env[i]);
  protobuf_c_message_free_unpacked (req_msg, NULL);
  return rc;
}

static int
handle_status (rpc_call_t *call, void *user, err_t *err)
{
  RECV (call, Sandbox__V1__StatusRequest, sandbox__v1__status_request__descriptor, req, err);
  protobuf_c_message_free_unpacked (req_msg, NULL);
  (void) req;
  const sbx_config_t *cfg = sbx_runtime_config (service_rt);
  Sandbox__V1__StatusResponse resp = SANDBOX__V1__STATUS_RESPONSE__INIT;
  resp.allow_egress = cfg->allow_egress;
  resp.sandboxes = (uint32_t) sbx_count (service_rt);
  resp.max_sandboxes = (uint32_t) cfg->max_sandboxes;
  resp.store = (char *) snap_rpc_store_kind ();
  return rpc_call_reply (call, &resp.base, err);
}

static const service_method_t service_methods[] = {
    {"/sandbox.v1.Sandbox/Launch", handle_launch},
    {"/sandbox.v1.Sandbox/Restore", snap_rpc_restore},
    {"/sandbox.v1.Sandbox/Exec", handle_exec},
    {"/sandbox.v1.Sandbox/ExportSnapshot", snap_rpc_export},
    {"/sandbox.v1.Sandbox/PersistSnapshot", snap_rpc_persist},
    {"/sandbox.v1.Sandbox/Connect", snap_rpc_connect},
    {"/sandbox.v1.Sandbox/Delete", handle_delete},
    {"/sandbox.v1.Sandbox/Get", handle_get},
    {"/sandbox.v1.Sandbox/List", handle_list},
    {"/sandbox.v1.Sandbox/Status", handle_status},
};

static int
guarded (rpc_call_t *call, void *user, err_t *err)
{
  const service_method_t *m = user;
  if (service_secret == NULL || service_secret[0] == '\0')
    {
      rpc_call_finish (call, GRPC_STATUS_UNAVAILABLE, "gateway secret not configured");
      return 0;
    }
  cleanup_free char *auth = rpc_call_metadata (call, "authorization");
  if (!bearer_matches (auth, service_secret))
    {
      log_fields (SEV_WARNING, json_pack ("{s:s}", "method", rpc_call_method (call)),
                  "rejected a call with a missing or wrong bearer token");
      rpc_call_finish (call, GRPC_STATUS_UNAUTHENTICATED, "invalid or missing bearer token");
      return 0;
    }
  return m->fn (call, NULL, err);
}

int
service_register (rpc_server_t *server, const char *secret, sbx_runtime_t *rt, err_t *err)
{
  service_secret = secret;
  service_rt = rt;
  for (size_t i = 0; i < sizeof service_methods / sizeof service_methods[0]; i++)
    if (rpc_server_add_method (server, service_methods[i].path, guarded, (void *) &service_methods[i], err) < 0)
      return -1;
  return 0;
}
