/* api/sandbox: the handlers of the sandbox methods — Launch, Get, Delete,
 * List, Extend, Exec, Status (see internal.h). No state: everything comes from the
 * service's context. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/labels.h"
#include "common/log.h"
#include "gateway/api/internal.h"
#include "gateway/snapshot/session.h"

int
api_launch (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__launch_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__LaunchRequest *req = (Sandbox__V1__LaunchRequest *) m;
  if (rpc_call_deadline_ms_left (call) <= 0)
    return err_make (err, ETIMEDOUT, "deadline exceeded before the launch");
  __attribute__ ((cleanup (api_spec_release))) api_spec_t spec = {0};
  if (api_spec_from_launch (req, &spec, err) < 0)
    return -1;
  sbx_info_t info;
  int rc = req->image != NULL && req->image[0] != '\0'
               ? api_launch_on_image (call, ctx, req->sandbox_id, &spec.spec, req->image, &info, err)
               : sbx_launch_spec (ctx->rt, req->sandbox_id, &spec.spec, NULL, NULL, NULL, &info, err);
  if (rc < 0 || api_undo_if_gone (call, ctx->rt, req->sandbox_id, err) < 0)
    return -1;
  return api_reply_info_labeled (call, &info, spec.labels, err);
}

int
api_get (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__get_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__GetRequest *req = (Sandbox__V1__GetRequest *) m;
  sbx_info_t info;
  cleanup_free char **labels = NULL;
  if (sbx_get (ctx->rt, req->sandbox_id, &info, err) < 0
      || sbx_labels_get (ctx->rt, req->sandbox_id, &labels, err) < 0)
    return -1;
  return api_reply_info_labeled (call, &info, labels, err);
}

int
api_extend (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__extend_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ExtendRequest *req = (Sandbox__V1__ExtendRequest *) m;
  sbx_info_t info;
  cleanup_free char **labels = NULL;
  if (sbx_extend (ctx->rt, req->sandbox_id, req->idle_ttl_seconds, req->max_lifetime_seconds, &info, err) < 0
      || sbx_labels_get (ctx->rt, req->sandbox_id, &labels, err) < 0)
    return -1;
  return api_reply_info_labeled (call, &info, labels, err);
}

/* Answers a List with `infos` (their resources and labels). */
static int
list_reply (rpc_call_t *call, const sbx_info_t *infos, size_t n, err_t *err)
{
  cleanup_free Sandbox__V1__SandboxInfo *pbs = calloc (n + 1, sizeof *pbs);
  cleanup_free Sandbox__V1__SandboxInfo **ptrs = calloc (n + 1, sizeof *ptrs);
  cleanup_free Sandbox__V1__Resources *res = calloc (n + 1, sizeof *res);
  cleanup_free api_labels_pb_t *lps = calloc (n + 1, sizeof *lps);
  if (pbs == NULL || ptrs == NULL || res == NULL || lps == NULL)
    return err_make (err, ENOMEM, "List: out of memory");
  int rc = 0;
  size_t made = 0;
  for (; made < n && rc == 0; made++)
    {
      api_info_to_proto (&infos[made], &pbs[made]);
      api_resources_to_proto (&infos[made].resources, &res[made]);
      pbs[made].resources = &res[made];
      pbs[made].expires_at_unix_ms = infos[made].expires_at_ms;
      pbs[made].idle_ttl_seconds = (uint32_t) infos[made].lifetime.idle_ttl_seconds;
      pbs[made].max_lifetime_seconds = (uint32_t) infos[made].lifetime.max_lifetime_seconds;
      rc = api_labels_to_proto (infos[made].labels, &lps[made], &pbs[made], err);
      ptrs[made] = &pbs[made];
    }
  if (rc == 0)
    {
      Sandbox__V1__ListResponse resp = SANDBOX__V1__LIST_RESPONSE__INIT;
      resp.n_sandboxes = n;
      resp.sandboxes = ptrs;
      rc = rpc_call_reply (call, &resp.base, err);
    }
  for (size_t i = 0; i < made; i++)
    api_labels_pb_release (&lps[i]);
  return rc;
}

int
api_delete (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__delete_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__DeleteRequest *req = (Sandbox__V1__DeleteRequest *) m;
  int rc = sbx_delete (ctx->rt, req->sandbox_id, err);
  bool snapshot_deleted = false;
  if (req->delete_snapshot && (rc == 0 || err->status == ENOENT))
    {
      /* The snapshot goes too; NOT_FOUND only when neither existed. */
      bool live = rc == 0;
      err_release (err);
      rc = snap_delete_stored (ctx->store, req->sandbox_id, &snapshot_deleted, err);
      if (rc == 0 && !live && !snapshot_deleted)
        rc = sbx_err_not_found (err, req->sandbox_id, ", and no stored snapshot");
    }
  if (rc < 0)
    return -1;
  Sandbox__V1__DeleteResponse resp = SANDBOX__V1__DELETE_RESPONSE__INIT;
  resp.snapshot_deleted = snapshot_deleted;
  return rpc_call_reply (call, &resp.base, err);
}

int
api_list (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__list_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ListRequest *req = (Sandbox__V1__ListRequest *) m;
  cleanup_free lbl_selector_t *sel = malloc (sizeof *sel);
  if (sel == NULL)
    return err_make (err, ENOMEM, "List: out of memory");
  if (lbl_selector_parse (req->label_selector, sel, err) < 0)
    return -1;
  cleanup_bulk api_bulk_t bulk;
  api_bulk_enter (&bulk);
  sbx_info_t *infos = NULL;
  size_t n = 0;
  if (sbx_list_matching (ctx->rt, sel->n > 0 ? api_selector_match : NULL, sel, &infos, &n, err) < 0)
    return -1;
  int rc = list_reply (call, infos, n, err);
  for (size_t i = 0; i < n; i++)
    free (infos[i].labels);
  free (infos);
  return rc;
}

/* Exec's sink. */
typedef struct exec_call_s
{
  rpc_call_t *call;
} exec_call_t;

/* Output chunks become ExecEvents on the call, sent from the exec's own
 * buffers. The send is started, not waited for: a client that does not
 * read holds the exec's reading (exec_ready), never its deadline. */
static int
exec_output (void *ctx, int stream, const uint8_t *data, size_t len)
{
  cleanup_err err_t err = ERR_INIT;
  uint32_t field = stream == 1 ? API_FIELD_EXEC_EVENT_STDOUT : API_FIELD_EXEC_EVENT_STDERR;
  int rc = api_send_bytes_field_start (((exec_call_t *) ctx)->call, field, data, len, &err);
  return rc;
}

static int
exec_ready (void *ctx, int wait_ms)
{
  cleanup_err err_t err = ERR_INIT;
  int rc = rpc_call_send_wait_for (((exec_call_t *) ctx)->call, wait_ms, &err);
  return rc;
}

static bool
exec_cancelled (void *ctx)
{
  /* At shutdown, calls still running after the grace period are cancelled,
   * which this sees too. */
  return rpc_call_cancelled (((exec_call_t *) ctx)->call);
}

/* Answers with the final ExecEvent, how the command ended, and the status
 * in one go. */
static int
send_exit (rpc_call_t *call, const sbx_exec_result_t *res, err_t *err)
{
  if (res->cancelled)
    return err_make (err, ECANCELED, "exec cancelled: %s", res->message);
  Sandbox__V1__ExitStatus st;
  api_exit_to_proto (res, &st);
  Sandbox__V1__ExecEvent ev = SANDBOX__V1__EXEC_EVENT__INIT;
  ev.event_case = SANDBOX__V1__EXEC_EVENT__EVENT_EXIT;
  ev.exit = &st;
  if (rpc_call_reply (call, &ev.base, err) < 0)
    return -1;
  rpc_call_finish (call, GRPC_STATUS_OK, NULL);
  return 0;
}

static void
cleanup_env_fn (char ***env)
{
  api_env_free (*env);
}

int
api_exec (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__exec_request__descriptor, &m, err) < 0)
    return -1;
  Sandbox__V1__ExecRequest *req = (Sandbox__V1__ExecRequest *) m;
  if (req->n_argv == 0)
    return err_make (err, EINVAL, "argv must have at least one element");
  cleanup_free char **argv = calloc (req->n_argv + 1, sizeof *argv);
  if (argv == NULL)
    return err_make (err, ENOMEM, "Exec: out of memory");
  memcpy (argv, req->argv, req->n_argv * sizeof *argv);
  __attribute__ ((cleanup (cleanup_env_fn))) char **env = NULL;
  if (api_env_from_proto (req->env, req->n_env, &env, err) < 0)
    return -1;
  __attribute__ ((cleanup (cleanup_env_fn))) char **img_env = NULL;
  cleanup_free char *img_cwd = NULL;
  sbx_exec_req_t user = {0};
  if (api_image_defaults (ctx, req->sandbox_id, env, &img_env, &img_cwd, &user, err) < 0)
    return -1;
  sbx_exec_req_t xr = {
      .as_user = user.as_user,
      .uid = user.uid,
      .gid = user.gid,
      .id = req->sandbox_id,
      .argv = argv,
      .env = img_env != NULL ? img_env : env,
      .cwd = req->cwd != NULL && req->cwd[0] != '\0' ? req->cwd : img_cwd,
      .stdin_data = req->stdin.data,
      .stdin_len = req->stdin.len,
      .timeout_seconds = req->timeout_seconds,
  };
  exec_call_t xc = {.call = call};
  sbx_exec_sink_t sink = {.output = exec_output, .cancelled = exec_cancelled, .ready = exec_ready, .ctx = &xc};
  sbx_exec_result_t res;
  sbx_exec_t *run = NULL;
  if (sbx_exec_run (ctx->rt, &xr, &sink, &res, &run, err) < 0)
    return -1;
  /* The caller has its answer before the exec cleans up. */
  int rc = send_exit (call, &res, err);
  sbx_exec_finish (run);
  return rc;
}

int
api_status (rpc_call_t *call, const api_ctx_t *ctx, err_t *err)
{
  cleanup_message ProtobufCMessage *m = NULL;
  if (api_recv_request (call, &sandbox__v1__status_request__descriptor, &m, err) < 0)
    return -1;
  const sbx_config_t *cfg = sbx_runtime_config (ctx->rt);
  Sandbox__V1__StatusResponse resp = SANDBOX__V1__STATUS_RESPONSE__INIT;
  resp.allow_egress = cfg->allow_egress;
  resp.sandboxes = (uint32_t) sbx_count (ctx->rt);
  resp.pooled = (uint32_t) sbx_pool_count (ctx->rt);
  resp.max_sandboxes = (uint32_t) cfg->max_sandboxes;
  resp.store = (char *) (ctx->store != NULL ? ctx->store->kind : "");
  resp.user_namespaces = cfg->userns;
  resp.gateway_name = (char *) (ctx->gateway_name != NULL ? ctx->gateway_name : "");
  char *warnings[2];
  if (!cfg->userns)
    warnings[resp.n_warnings++] = (char *) "SANDBOX_USERNS is off: sandbox root is host root, and an escape from a "
                                           "sandbox is an escape to host root";
  if (cfg->allow_egress && !sbx_egress_filtered (ctx->rt))
    warnings[resp.n_warnings++] = (char *) "egress is kept from the host's and link-local addresses only by routes "
                                           "inside each sandbox (no cgroup v2 here for the filter outside them)";
  resp.warnings = warnings;
  return rpc_call_reply (call, &resp.base, err);
}
