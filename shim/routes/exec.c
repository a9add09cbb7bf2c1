/* routes/exec: POST /sandboxes/{id}/exec — buffered JSON (the contract) or,
 * with Accept: application/x-ndjson, one JSON event per line as output
 * arrives. While the call runs, the hang-up watcher cancels it if the
 * client leaves. State: per request. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/routes/routes.h"

/* ---- POST /sandboxes/{id}/exec -------------------------------------------------- */

typedef struct exec_out_s
{
  uint8_t *data;
  size_t len, cap;
  bool truncated;
} exec_out_t;

static void
exec_out_add (exec_out_t *o, const uint8_t *data, size_t len)
{
  size_t max = (size_t) shim.cfg.max_exec_output;
  if (o->len + len > max)
    {
      len = max - o->len;
      o->truncated = true;
    }
  if (len == 0)
    return;
  if (o->len + len > o->cap)
    {
      size_t cap = o->cap ? o->cap : 4096;
      while (cap < o->len + len)
        cap *= 2;
      if (cap > max)
        cap = max;
      uint8_t *d = realloc (o->data, cap);
      if (d == NULL)
        {
          o->truncated = true;
          return;
        }
      o->data = d;
      o->cap = cap;
    }
  memcpy (o->data + o->len, data, len);
  o->len += len;
}

/* Starts the Exec call for the validated body. */
static rpc_client_call_t *
exec_start (shim_req_t *r, const shim_exec_body_t *b, rpc_status_t *st)
{
  Sandbox__V1__ExecRequest req = SANDBOX__V1__EXEC_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.argv = b->argv;
  req.n_argv = b->argc;
  req.timeout_seconds = (uint32_t) b->timeout;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  if (rpc_client_start (shim.channel, "/sandbox.v1.Sandbox/Exec", b->timeout * 1000 + ROUTE_EXEC_MARGIN_MS, shim.md,
                        shim.n_md, &c, &err)
          < 0
      || rpc_client_send (c, &req.base, &err) < 0 || rpc_client_close_send (c, &err) < 0)
    {
      if (c != NULL)
        {
          rpc_client_finish (c, st);
          rpc_client_destroy (c);
        }
      else
        {
          st->code = GRPC_STATUS_UNAVAILABLE;
          st->details = strdup (err_msg (&err));
        }
      err_release (&err);
      return NULL;
    }
  return c;
}

static json_t *
exit_json (const Sandbox__V1__ExitStatus *x)
{
  json_t *code;
  if (x->timed_out)
    code = json_null ();
  else if (x->signal != 0)
    code = json_integer (-x->signal); /* as Python's subprocess reports it */
  else
    code = json_integer (x->exit_code);
  return json_pack ("{s:o, s:b}", "exit_code", code, "timed_out", x->timed_out);
}

/* One exec event as an NDJSON line (route_ndjson). */
static json_t *
exec_event_json (const ProtobufCMessage *m)
{
  const Sandbox__V1__ExecEvent *e = (const Sandbox__V1__ExecEvent *) m;
  if (e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT
      || e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDERR)
    {
      bool out = e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT;
      ProtobufCBinaryData d = out ? e->stdout : e->stderr;
      metrics_bytes (false, d.len);
      cleanup_free char *b64 = route_base64 (d.data, d.len);
      return json_pack ("{s:s}", out ? "stdout_b64" : "stderr_b64", b64 ? b64 : "");
    }
  if (e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_EXIT && e->exit != NULL)
    {
      metrics_exec_duration ((double) e->exit->duration_ms / 1000.0);
      return exit_json (e->exit);
    }
  return NULL;
}

static bool
wants_ndjson (shim_req_t *r)
{
  const char *accept = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
  return accept != NULL && strcasestr (accept, "application/x-ndjson") != NULL;
}

/* The contract's answer: the exit status with both outputs in base64.
 * Takes `result`. */
static struct MHD_Response *
exec_result (json_t *result, const exec_out_t *out, const exec_out_t *err_out, unsigned *status)
{
  metrics_bytes (false, out->len + err_out->len);
  cleanup_free char *o64 = route_base64 (out->data, out->len);
  cleanup_free char *e64 = route_base64 (err_out->data, err_out->len);
  if (o64 == NULL || e64 == NULL)
    {
      json_decref (result);
      return shim_detail (503, "Out of memory", status);
    }
  json_object_set_new (result, "stdout_b64", json_string (o64));
  json_object_set_new (result, "stderr_b64", json_string (e64));
  if (out->truncated || err_out->truncated)
    json_object_set_new (result, "truncated", json_true ());
  return shim_json (result, 200, status);
}

/* Collects the whole exec, then answers with one JSON object. Takes `c`. */
static struct MHD_Response *
exec_buffered (shim_req_t *r, rpc_client_call_t *c, unsigned *status)
{
  watch_t *w = watch_add (shim_req_fd (r), c);
  exec_out_t out = {0}, err_out = {0};
  json_t *result = NULL;
  for (;;)
    {
      cleanup_message ProtobufCMessage *m = NULL;
      err_t err = ERR_INIT;
      int rc = rpc_client_recv (c, &sandbox__v1__exec_event__descriptor, &m, &err);
      err_release (&err);
      if (rc <= 0)
        break;
      Sandbox__V1__ExecEvent *ev = (Sandbox__V1__ExecEvent *) m;
      if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT)
        exec_out_add (&out, ev->stdout.data, ev->stdout.len);
      else if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDERR)
        exec_out_add (&err_out, ev->stderr.data, ev->stderr.len);
      else if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_EXIT && ev->exit != NULL && result == NULL)
        {
          result = exit_json (ev->exit);
          metrics_exec_duration ((double) ev->exit->duration_ms / 1000.0);
        }
    }
  bool hung_up = watch_remove (w);
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = rpc_client_finish (c, &st);
  rpc_client_destroy (c);
  struct MHD_Response *resp;
  if (code == GRPC_STATUS_OK && result != NULL)
    resp = exec_result (take_ptr (&result), &out, &err_out, status);
  else if (code == GRPC_STATUS_OK)
    resp = shim_detail (502, "Gateway ended the exec without an exit status", status);
  else if (hung_up)
    resp = shim_detail (499, "Client closed the request", status);
  else
    resp = shim_gateway_error (code, &st, status);
  json_decref (result);
  rpc_status_release (&st);
  free (out.data);
  free (err_out.data);
  return resp;
}

struct MHD_Response *
route_exec (shim_req_t *r, unsigned *status)
{
  shim_errors_t e;
  shim_errors_init (&e);
  shim_exec_body_t body;
  const char *ct = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!shim_parse_exec (ct, r->body, r->len, &body, &e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);

  rpc_status_t st = RPC_STATUS_INIT;
  rpc_client_call_t *c = exec_start (r, &body, &st);
  shim_exec_body_release (&body);
  if (c == NULL)
    {
      struct MHD_Response *out = shim_gateway_error (st.code, &st, status);
      rpc_status_release (&st);
      return out;
    }
  return wants_ndjson (r)
             ? route_ndjson (r, c, &sandbox__v1__exec_event__descriptor, exec_event_json, shim_gateway_error, status)
             : exec_buffered (r, c, status);
}
