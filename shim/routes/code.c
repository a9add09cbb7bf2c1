/* routes/code: code contexts — POST /sandboxes/{id}/code (RunCode: NDJSON
 * events as the kernel produces them with Accept: application/x-ndjson,
 * else one JSON document gathered up to ROUTE_CODE_ANSWER_MAX), and
 * POST/GET /sandboxes/{id}/contexts, DELETE /sandboxes/{id}/contexts/{cid},
 * POST /sandboxes/{id}/contexts/{cid}/restart. Images (PNG, JPEG) are
 * base64 in JSON. State: per request. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cleanup.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/hangup.h"
#include "shim/validate.h"
#include "shim/routes/routes.h"

/* The most bytes of events one buffered answer gathers (beyond: 503, and
 * NDJSON streams without a bound). */
#define ROUTE_CODE_ANSWER_MAX (64 * 1024 * 1024)
/* The longest cell timeout a request may ask for, in seconds (the
 * gateway's SBX_EXEC_MAX_TIMEOUT); 0 or absent: the gateway's default. */
#define ROUTE_CODE_MAX_TIMEOUT 3600
#define ROUTE_CODE_DEFAULT_TIMEOUT 1800
/* Deadline of CreateContext and RestartContext (a kernel's start). */
#define ROUTE_CONTEXT_CALL_MS 120000

/* A 422 in FastAPI's shape, for one body field. */
static struct MHD_Response *
invalid (const char *field, const char *msg, unsigned *status)
{
  shim_errors_t e;
  shim_errors_init (&e);
  shim_errors_add (&e, "value_error", "body", field, msg);
  return shim_json (shim_errors_take (&e), 422, status);
}

static bool
wants_ndjson (shim_req_t *r)
{
  const char *accept = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
  return accept != NULL && strcasestr (accept, "application/x-ndjson") != NULL;
}

/* The request body as a JSON object (an empty body is {}); NULL with the
 * 422 answer in *out. */
static json_t *
body_object (shim_req_t *r, bool empty_ok, struct MHD_Response **out, unsigned *status)
{
  if (r->len == 0 && empty_ok)
    return json_object ();
  json_t *j = json_loadb (r->body, r->len, JSON_REJECT_DUPLICATES, NULL);
  if (!json_is_object (j))
    {
      json_decref (j);
      *out = invalid (NULL, "The body must be a JSON object", status);
      return NULL;
    }
  return j;
}

/* An optional string member; false when present but not a string. */
static bool
opt_string (json_t *o, const char *name, const char **out)
{
  json_t *v = json_object_get (o, name);
  *out = NULL;
  if (v == NULL || json_is_null (v))
    return true;
  *out = json_string_value (v);
  return *out != NULL;
}

static json_t *
context_json (const Sandbox__V1__CodeContext *c)
{
  return json_pack ("{s:s, s:s, s:s, s:I, s:b}", "context_id", c->context_id, "language", c->language, "cwd", c->cwd,
                    "created_at_unix_ms", (json_int_t) c->created_at_unix_ms, "is_default", c->is_default);
}

static struct MHD_Response *
unary_context (shim_req_t *r, const char *method, const ProtobufCMessage *req, unsigned code, unsigned *status)
{
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int rc
      = route_unary (r->id, method, req, &sandbox__v1__code_context__descriptor, &resp, &st, ROUTE_CONTEXT_CALL_MS);
  struct MHD_Response *out;
  if (rc == 0 && resp != NULL)
    out = shim_json (context_json ((Sandbox__V1__CodeContext *) resp), code, status);
  else
    out = shim_gateway_error_named (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

/* ---- contexts ------------------------------------------------------------------ */

struct MHD_Response *
route_context_create (shim_req_t *r, unsigned *status)
{
  struct MHD_Response *out = NULL;
  json_t *b = body_object (r, true, &out, status);
  if (b == NULL)
    return out;
  const char *language = NULL, *cwd = NULL;
  json_t *env = json_object_get (b, "env");
  if (!opt_string (b, "language", &language) || !opt_string (b, "cwd", &cwd)
      || (env != NULL && !json_is_object (env)))
    {
      json_decref (b);
      return invalid ("language", "language and cwd must be strings, env an object of strings", status);
    }
  size_t n = json_object_size (env), i = 0;
  Sandbox__V1__CreateContextRequest__EnvEntry *entries = calloc (n + 1, sizeof *entries);
  Sandbox__V1__CreateContextRequest__EnvEntry **ptrs = calloc (n + 1, sizeof *ptrs);
  const char *k;
  json_t *v;
  bool bad = entries == NULL || ptrs == NULL;
  json_object_foreach (env, k, v)
  {
    if (bad || !json_is_string (v))
      {
        bad = true;
        break;
      }
    sandbox__v1__create_context_request__env_entry__init (&entries[i]);
    entries[i].key = (char *) k;
    entries[i].value = (char *) json_string_value (v);
    ptrs[i] = &entries[i];
    i++;
  }
  if (bad)
    out = invalid ("env", "env must be an object of strings", status);
  else
    {
      Sandbox__V1__CreateContextRequest req = SANDBOX__V1__CREATE_CONTEXT_REQUEST__INIT;
      req.sandbox_id = r->id;
      req.language = (char *) (language ? language : "");
      req.cwd = (char *) (cwd ? cwd : "");
      req.env = ptrs;
      req.n_env = n;
      out = unary_context (r, "/sandbox.v1.Sandbox/CreateContext", &req.base, 201, status);
    }
  free (entries);
  free (ptrs);
  json_decref (b);
  return out;
}

struct MHD_Response *
route_context_list (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__ListContextsRequest req = SANDBOX__V1__LIST_CONTEXTS_REQUEST__INIT;
  req.sandbox_id = r->id;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int rc = route_unary (r->id, "/sandbox.v1.Sandbox/ListContexts", &req.base,
                        &sandbox__v1__list_contexts_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS);
  struct MHD_Response *out;
  if (rc == 0 && resp != NULL)
    {
      Sandbox__V1__ListContextsResponse *l = (Sandbox__V1__ListContextsResponse *) resp;
      json_t *arr = json_array (), *langs = json_array ();
      for (size_t i = 0; i < l->n_contexts; i++)
        json_array_append_new (arr, context_json (l->contexts[i]));
      for (size_t i = 0; i < l->n_languages; i++)
        json_array_append_new (langs, json_string (l->languages[i]));
      out = shim_json (json_pack ("{s:o, s:o}", "contexts", arr, "languages", langs), 200, status);
    }
  else
    out = shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

struct MHD_Response *
route_context_delete (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__DeleteContextRequest req = SANDBOX__V1__DELETE_CONTEXT_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.context_id = r->pid;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int rc = route_unary (r->id, "/sandbox.v1.Sandbox/DeleteContext", &req.base,
                        &sandbox__v1__delete_context_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  struct MHD_Response *out = rc == 0 ? shim_empty (204, status) : shim_gateway_error_named (st.code, &st, status);
  rpc_status_release (&st);
  return out;
}

struct MHD_Response *
route_context_restart (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__RestartContextRequest req = SANDBOX__V1__RESTART_CONTEXT_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.context_id = r->pid;
  return unary_context (r, "/sandbox.v1.Sandbox/RestartContext", &req.base, 200, status);
}

/* ---- POST /sandboxes/{id}/code ------------------------------------------------------ */

static json_t *
result_json (const Sandbox__V1__CodeResult *res)
{
  json_t *j = json_pack ("{s:b}", "is_main_result", res->is_main_result);
  const struct
  {
    const char *name, *value;
  } texts[] = {{"text", res->text}, {"html", res->html},   {"markdown", res->markdown},    {"svg", res->svg},
               {"json", res->json}, {"latex", res->latex}, {"javascript", res->javascript}};
  for (size_t i = 0; j != NULL && i < sizeof texts / sizeof texts[0]; i++)
    if (texts[i].value != NULL && texts[i].value[0] != '\0')
      json_object_set_new (j, texts[i].name, json_string (texts[i].value));
  const struct
  {
    const char *name;
    ProtobufCBinaryData d;
  } images[] = {{"png", res->png}, {"jpeg", res->jpeg}};
  for (size_t i = 0; j != NULL && i < 2; i++)
    if (images[i].d.len > 0)
      {
        cleanup_free char *b64 = route_base64 (images[i].d.data, images[i].d.len);
        json_object_set_new (j, images[i].name, b64 ? json_string (b64) : json_null ());
      }
  return j;
}

static json_t *
error_json (const Sandbox__V1__CodeError *e)
{
  json_t *tb = json_array ();
  for (size_t i = 0; i < e->n_traceback; i++)
    json_array_append_new (tb, json_string (e->traceback[i]));
  return json_pack ("{s:s, s:s, s:o}", "name", e->name, "value", e->value, "traceback", tb);
}

/* One event as an NDJSON line: {"type": ..., ...}. */
static json_t *
code_event_json (const ProtobufCMessage *m, void *ctx)
{
  const Sandbox__V1__CodeEvent *e = (const Sandbox__V1__CodeEvent *) m;
  json_t *j = NULL;
  switch (e->event_case)
    {
    case SANDBOX__V1__CODE_EVENT__EVENT_STDOUT:
      j = json_pack ("{s:s, s:s}", "type", "stdout", "text", e->stdout);
      break;
    case SANDBOX__V1__CODE_EVENT__EVENT_STDERR:
      j = json_pack ("{s:s, s:s}", "type", "stderr", "text", e->stderr);
      break;
    case SANDBOX__V1__CODE_EVENT__EVENT_RESULT:
      j = result_json (e->result);
      if (j != NULL)
        json_object_set_new (j, "type", json_string ("result"));
      break;
    case SANDBOX__V1__CODE_EVENT__EVENT_ERROR:
      j = error_json (e->error);
      if (j != NULL)
        json_object_set_new (j, "type", json_string ("error"));
      break;
    case SANDBOX__V1__CODE_EVENT__EVENT_END:
      j = json_pack ("{s:s, s:i, s:I, s:b, s:s}", "type", "end", "execution_count", (int) e->end->execution_count,
                     "duration_ms", (json_int_t) e->end->duration_ms, "restarted", e->end->restarted, "message",
                     e->end->message);
      break;
    default: break;
    }
  (void) ctx;
  return j;
}

typedef struct doc_s
{
  json_t *results, *out, *err, *error, *end;
  size_t bytes;
} doc_t;

static void
doc_release (doc_t *d)
{
  json_decref (d->results);
  json_decref (d->out);
  json_decref (d->err);
  json_decref (d->error);
  json_decref (d->end);
}

/* Gathers the call's events into `d`: 1 at the end, -1 past
 * ROUTE_CODE_ANSWER_MAX. */
static int
doc_collect (rpc_client_call_t *c, doc_t *d)
{
  for (;;)
    {
      cleanup_message ProtobufCMessage *m = NULL;
      err_t rerr = ERR_INIT;
      int rc = rpc_client_recv (c, &sandbox__v1__code_event__descriptor, &m, &rerr);
      err_release (&rerr);
      if (rc <= 0)
        return 1;
      d->bytes += protobuf_c_message_get_packed_size (m) * 4 / 3 + 64;
      if (d->bytes > ROUTE_CODE_ANSWER_MAX)
        return -1;
      const Sandbox__V1__CodeEvent *e = (const Sandbox__V1__CodeEvent *) m;
      switch (e->event_case)
        {
        case SANDBOX__V1__CODE_EVENT__EVENT_STDOUT: json_array_append_new (d->out, json_string (e->stdout)); break;
        case SANDBOX__V1__CODE_EVENT__EVENT_STDERR: json_array_append_new (d->err, json_string (e->stderr)); break;
        case SANDBOX__V1__CODE_EVENT__EVENT_RESULT:
          json_array_append_new (d->results, result_json (e->result));
          break;
        case SANDBOX__V1__CODE_EVENT__EVENT_ERROR:
          if (d->error == NULL)
            d->error = error_json (e->error);
          break;
        case SANDBOX__V1__CODE_EVENT__EVENT_END:
          json_decref (d->end);
          d->end = code_event_json (m, NULL);
          break;
        default: break;
        }
    }
}

static struct MHD_Response *
code_buffered (shim_req_t *r, rpc_client_call_t *c, unsigned *status)
{
  doc_t d = {.results = json_array (), .out = json_array (), .err = json_array ()};
  hangup_t *w = hangup_add (shim_req_fd (r), c);
  int held = doc_collect (c, &d);
  bool hung_up = hangup_remove (w);
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = held > 0 ? rpc_client_finish (c, &st) : GRPC_STATUS_CANCELLED;
  rpc_client_destroy (c);
  struct MHD_Response *resp;
  if (held < 0)
    resp = shim_detail (503,
                        "The cell's output exceeds what the shim gathers into one answer; stream it with Accept: "
                        "application/x-ndjson",
                        status);
  else if (code == GRPC_STATUS_OK && d.end != NULL)
    {
      json_t *doc = json_pack ("{s:O, s:{s:O, s:O}, s:O, s:O, s:O, s:O, s:O}", "results", d.results, "logs", "stdout",
                               d.out, "stderr", d.err, "error", d.error ? d.error : json_null (), "execution_count",
                               json_object_get (d.end, "execution_count"), "duration_ms",
                               json_object_get (d.end, "duration_ms"), "restarted",
                               json_object_get (d.end, "restarted"), "message", json_object_get (d.end, "message"));
      resp = doc ? shim_json (doc, 200, status) : shim_detail (503, "Out of memory", status);
    }
  else if (code == GRPC_STATUS_OK)
    resp = shim_detail (502, "Gateway ended the cell without its end", status);
  else if (hung_up)
    resp = shim_detail (499, "Client closed the request", status);
  else
    resp = shim_gateway_error_named (code, &st, status);
  rpc_status_release (&st);
  doc_release (&d);
  return resp;
}

struct MHD_Response *
route_code (shim_req_t *r, unsigned *status)
{
  struct MHD_Response *out = NULL;
  json_t *b = body_object (r, false, &out, status);
  if (b == NULL)
    return out;
  const char *codes = NULL, *language = NULL, *context_id = NULL;
  json_t *timeout = json_object_get (b, "timeout");
  bool ok = opt_string (b, "code", &codes) && codes != NULL && opt_string (b, "language", &language)
            && opt_string (b, "context_id", &context_id)
            && (timeout == NULL || json_is_null (timeout)
                || (json_is_integer (timeout) && json_integer_value (timeout) >= 0
                    && json_integer_value (timeout) <= ROUTE_CODE_MAX_TIMEOUT));
  if (!ok)
    {
      json_decref (b);
      return invalid ("code",
                      "code must be a string; language and context_id strings; timeout an integer of seconds "
                      "from 0 to 3600",
                      status);
    }
  uint32_t t = json_is_integer (timeout) ? (uint32_t) json_integer_value (timeout) : 0;
  Sandbox__V1__RunCodeRequest req = SANDBOX__V1__RUN_CODE_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.code = (char *) codes;
  req.language = (char *) (language ? language : "");
  req.context_id = (char *) (context_id ? context_id : "");
  req.timeout_seconds = t;
  rpc_status_t st = RPC_STATUS_INIT;
  int64_t deadline = (int64_t) (t ? t : ROUTE_CODE_DEFAULT_TIMEOUT) * 1000 + ROUTE_EXEC_MARGIN_MS;
  rpc_client_call_t *c
      = route_call_open (r->id, "/sandbox.v1.Sandbox/RunCode", deadline, &req.base, NULL, 0, true, &st);
  json_decref (b);
  if (c == NULL)
    {
      out = shim_gateway_error_named (st.code, &st, status);
      rpc_status_release (&st);
      return out;
    }
  if (!wants_ndjson (r))
    return code_buffered (r, c, status);
  return route_ndjson (r, c, &sandbox__v1__code_event__descriptor, code_event_json, NULL, shim_gateway_error_named,
                       status);
}
