/* api/service: the sandbox.v1.Sandbox method table, the authentication
 * guard in front of it, and what every handler shares (see api.h). State:
 * the api_t made at registration, immutable afterwards. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "common/bearer.h"
#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/api/internal.h"

/* A method of the service; `fn` runs only after admission (authentication). */
typedef struct api_method_s
{
  const char *path;
  api_handler_fn fn;
} api_method_t;

static const api_method_t api_methods[] = {
    {"/sandbox.v1.Sandbox/Launch", api_launch},
    {"/sandbox.v1.Sandbox/Restore", api_restore},
    {"/sandbox.v1.Sandbox/Exec", api_exec},
    {"/sandbox.v1.Sandbox/Run", api_run},
    {"/sandbox.v1.Sandbox/ListProcesses", api_list_processes},
    {"/sandbox.v1.Sandbox/SignalProcess", api_signal_process},
    {"/sandbox.v1.Sandbox/ExportSnapshot", api_export},
    {"/sandbox.v1.Sandbox/PersistSnapshot", api_persist},
    {"/sandbox.v1.Sandbox/Connect", api_connect},
    {"/sandbox.v1.Sandbox/Delete", api_delete},
    {"/sandbox.v1.Sandbox/Get", api_get},
    {"/sandbox.v1.Sandbox/Extend", api_extend},
    {"/sandbox.v1.Sandbox/List", api_list},
    {"/sandbox.v1.Sandbox/Status", api_status},
    {"/sandbox.v1.Sandbox/ReadFile", api_read_file},
    {"/sandbox.v1.Sandbox/WriteFile", api_write_file},
    {"/sandbox.v1.Sandbox/ListDir", api_list_dir},
    {"/sandbox.v1.Sandbox/Stat", api_stat},
    {"/sandbox.v1.Sandbox/Remove", api_remove},
    {"/sandbox.v1.Sandbox/Rename", api_rename},
    {"/sandbox.v1.Sandbox/MakeDir", api_make_dir},
    {"/sandbox.v1.Sandbox/Watch", api_watch},
    {"/sandbox.v1.Sandbox/Forward", api_forward},
    {"/sandbox.v1.Sandbox/ListPorts", api_list_ports},
    {"/sandbox.v1.Sandbox/PullImage", api_pull_image},
    {"/sandbox.v1.Sandbox/ListImages", api_list_images},
    {"/sandbox.v1.Sandbox/RemoveImage", api_remove_image},
    {"/sandbox.v1.Sandbox/CreateContext", api_create_context},
    {"/sandbox.v1.Sandbox/ListContexts", api_list_contexts},
    {"/sandbox.v1.Sandbox/RestartContext", api_restart_context},
    {"/sandbox.v1.Sandbox/DeleteContext", api_delete_context},
    {"/sandbox.v1.Sandbox/RunCode", api_run_code},
    {"/sandbox.v1.Sandbox/CreateTemplate", api_create_template},
    {"/sandbox.v1.Sandbox/ListTemplates", api_list_templates},
    {"/sandbox.v1.Sandbox/DeleteTemplate", api_delete_template},
};

#define N_METHODS (sizeof api_methods / sizeof api_methods[0])

/* What the call layer hands a method: the context and the method. */
typedef struct api_binding_s
{
  const api_ctx_t *ctx;
  const api_method_t *method;
} api_binding_t;

struct api_s
{
  api_ctx_t ctx;
  api_binding_t bindings[N_METHODS];
};

int
api_recv_request (rpc_call_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **out, err_t *err)
{
  int rc = rpc_call_recv (call, desc, out, err);
  if (rc == 0)
    return err_make (err, EINVAL, "%s: no request message", rpc_call_method (call));
  return rc < 0 ? -1 : 0;
}

int
api_undo_if_gone (rpc_call_t *call, sbx_runtime_t *rt, const char *id, err_t *err)
{
  if (!rpc_call_cancelled (call) && rpc_call_deadline_ms_left (call) > 0)
    return 0;
  /* Nobody will learn of this sandbox: it must not linger and count. */
  cleanup_err err_t derr = ERR_INIT;
  sbx_delete (rt, id, &derr);
  err_warn_release (&derr, "undo `%s`", id);
  return err_make (err, ETIMEDOUT, "the call ended (deadline or cancellation) before `%s` was ready: undone", id);
}

/* Admission, before the call gets a thread: the bearer secret, failing
 * closed when none is configured. */
static grpc_status_code
admit (rpc_call_t *call, void *user, const char **message)
{
  const api_binding_t *b = user;
  const char *secret = b->ctx->secret;
  if (secret == NULL || secret[0] == '\0')
    {
      *message = "gateway secret not configured";
      return GRPC_STATUS_UNAVAILABLE;
    }
  cleanup_free char *auth = rpc_call_metadata (call, "authorization");
  if (!bearer_matches (auth, secret))
    {
      /* Logged at most once a second (with the count since): anyone who
       * reaches the port can send thousands a second. */
      static atomic_llong last_ms, missed;
      struct timespec ts;
      clock_gettime (CLOCK_MONOTONIC, &ts);
      long long now = (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000, last = atomic_load (&last_ms);
      if (now - last >= 1000 && atomic_compare_exchange_strong (&last_ms, &last, now))
        log_fields (SEV_WARNING,
                    json_pack ("{s:s, s:I}", "method", rpc_call_method (call), "also_rejected",
                               (json_int_t) atomic_exchange (&missed, 0)),
                    "rejected a call with a missing or wrong bearer token");
      else
        atomic_fetch_add (&missed, 1);
      *message = "invalid or missing bearer token";
      return GRPC_STATUS_UNAUTHENTICATED;
    }
  return GRPC_STATUS_OK;
}

static int
dispatch (rpc_call_t *call, void *user, err_t *err)
{
  const api_binding_t *b = user;
  return b->method->fn (call, b->ctx, err);
}

int
api_register (rpc_server_t *server, const api_ctx_t *ctx, api_t **out, err_t *err)
{
  api_t *api = calloc (1, sizeof *api);
  if (api == NULL)
    return err_make (err, ENOMEM, "out of memory");
  api->ctx = *ctx;
  *out = api; /* also on failure: the server may hold bindings already */
  for (size_t i = 0; i < N_METHODS; i++)
    {
      api->bindings[i] = (api_binding_t){.ctx = &api->ctx, .method = &api_methods[i]};
      if (rpc_server_add_admitted_method (server, api_methods[i].path, admit, dispatch, &api->bindings[i], err) < 0)
        return -1;
    }
  return 0;
}

void
api_free (api_t *api)
{
  free (api);
}
