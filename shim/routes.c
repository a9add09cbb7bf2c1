/* routes: the REST contract, translated into sandbox.v1 gRPC calls.
 *
 * The contract (status codes, JSON fields, content types, error shapes)
 * is the one agent backends already speak; the extensions (NDJSON exec,
 * snapshot, connect, list, metrics) are additive. Every route runs on its
 * connection's thread and may block on the gateway; while it does, a
 * hang-up watcher (watch.h) cancels the call if the client leaves.
 */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "grpc/health/v1/health.pb-c.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/shim.h"

/* Deadline of short gateway calls (launch, delete, status...). */
#define SHORT_CALL_MS 60000
/* Extra time an exec call gets over the command's own timeout. */
#define EXEC_MARGIN_MS 60000

static int
unary (const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
       ProtobufCMessage **resp, rpc_status_t *st, int64_t timeout_ms)
{
  err_t err = ERR_INIT;
  int rc = rpc_client_unary (shim.channel, method, timeout_ms, shim.md, shim.n_md, req, desc, resp, st, &err);
  err_release (&err);
  return rc;
}

static char *
base64 (const uint8_t *data, size_t len)
{
  char *out = malloc (4 * ((len + 2) / 3) + 1);
  if (out != NULL)
    EVP_EncodeBlock ((unsigned char *) out, data, (int) len);
  return out;
}

/* Reads the boolean query parameter `name` into *out (unchanged when
 * absent). NULL when fine; otherwise the 422 body (the caller owns it). */
static json_t *
query_bool (shim_req_t *r, const char *name, bool *out)
{
  const char *q = MHD_lookup_connection_value (r->conn, MHD_GET_ARGUMENT_KIND, name);
  if (q == NULL || shim_parse_bool_text (q, out) == 0)
    return NULL;
  shim_errors_t e;
  shim_errors_init (&e);
  shim_errors_add (&e, "bool_parsing", "query", name, "Input should be a valid boolean");
  return shim_errors_take (&e);
}

/* ---- GET /health -------------------------------------------------------------- */

static struct MHD_Response *
health (shim_req_t *r, unsigned *status)
{
  Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hreq.service = "sandbox.v1.Sandbox";
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  err_t err = ERR_INIT;
  bool serving = rpc_client_unary (shim.channel, "/grpc.health.v1.Health/Check", 3000, NULL, 0, &hreq.base,
                                   &grpc__health__v1__health_check_response__descriptor, &resp, &st, &err)
                     == 0
                 && ((Grpc__Health__V1__HealthCheckResponse *) resp)->status
                        == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  err_release (&err);
  bool egress = false;
  if (serving)
    {
      Sandbox__V1__StatusRequest sreq = SANDBOX__V1__STATUS_REQUEST__INIT;
      if (unary ("/sandbox.v1.Sandbox/Status", &sreq.base, &sandbox__v1__status_response__descriptor, &resp, &st,
                 3000)
          == 0)
        {
          egress = ((Sandbox__V1__StatusResponse *) resp)->allow_egress;
          protobuf_c_message_free_unpacked (resp, NULL);
        }
      rpc_status_release (&st);
    }
  return shim_json (json_pack ("{s:b, s:b}", "cli_mounted", serving, "allow_egress", egress), 200, status);
}

/* ---- POST /sandboxes, GET /sandboxes, DELETE /sandboxes/{id} ------------------- */

static struct MHD_Response *
launch (shim_req_t *r, unsigned *status)
{
  shim_errors_t e;
  shim_errors_init (&e);
  shim_launch_body_t body;
  const char *ct = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!shim_parse_launch (ct, r->body, r->len, &body, &e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);
  snprintf (r->id, sizeof r->id, "%s", body.id);
  Sandbox__V1__LaunchRequest req = SANDBOX__V1__LAUNCH_REQUEST__INIT;
  req.sandbox_id = body.id;
  req.allow_egress = body.allow_egress;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (unary ("/sandbox.v1.Sandbox/Launch", &req.base, &sandbox__v1__sandbox_info__descriptor, &resp, &st,
             SHORT_CALL_MS)
      == 0)
    out = shim_json (json_pack ("{s:s}", "sandbox_id", body.id), 201, status);
  else if (st.code == GRPC_STATUS_ALREADY_EXISTS || st.code == GRPC_STATUS_INVALID_ARGUMENT
           || st.code == GRPC_STATUS_RESOURCE_EXHAUSTED || st.code == GRPC_STATUS_UNAUTHENTICATED
           || st.code == GRPC_STATUS_UNAVAILABLE || st.code == GRPC_STATUS_DEADLINE_EXCEEDED)
    out = shim_gateway_error (st.code, st.details, status);
  else
    {
      /* Any other failure to launch is the gateway's: 502 with its reason. */
      metrics_gateway_error (st.code);
      char detail[1024];
      snprintf (detail, sizeof detail, "Failed to launch sandbox: %.900s",
                st.details != NULL && st.details[0] ? st.details : rpc_status_name (st.code));
      out = shim_detail (502, detail, status);
    }
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

static struct MHD_Response *
list (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__ListRequest req = SANDBOX__V1__LIST_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (unary ("/sandbox.v1.Sandbox/List", &req.base, &sandbox__v1__list_response__descriptor, &resp, &st,
             SHORT_CALL_MS)
      == 0)
    {
      Sandbox__V1__ListResponse *l = (Sandbox__V1__ListResponse *) resp;
      json_t *arr = json_array ();
      for (size_t i = 0; i < l->n_sandboxes; i++)
        {
          Sandbox__V1__SandboxInfo *s = l->sandboxes[i];
          json_array_append_new (
              arr, json_pack ("{s:s, s:I, s:I, s:b, s:i, s:I, s:I}", "sandbox_id", s->sandbox_id, "created_at_ms",
                              (json_int_t) s->created_at_unix_ms, "last_used_ms", (json_int_t) s->last_used_unix_ms,
                              "allow_egress", s->allow_egress, "process_count", (int) s->process_count,
                              "disk_used_bytes", (json_int_t) s->disk_used_bytes, "disk_limit_bytes",
                              (json_int_t) s->disk_limit_bytes));
        }
      out = shim_json (json_pack ("{s:o}", "sandboxes", arr), 200, status);
    }
  else
    out = shim_gateway_error (st.code, st.details, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

static struct MHD_Response *
delete (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__DeleteRequest req = SANDBOX__V1__DELETE_REQUEST__INIT;
  req.sandbox_id = r->id;
  bool del_snap = false;
  json_t *bad = query_bool (r, "delete_snapshot", &del_snap);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  req.delete_snapshot = del_snap;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out
      = unary ("/sandbox.v1.Sandbox/Delete", &req.base, &sandbox__v1__delete_response__descriptor, &resp, &st,
               SHORT_CALL_MS)
                == 0
            ? shim_empty (204, status)
            : shim_gateway_error (st.code, st.details, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

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
  if (rpc_client_start (shim.channel, "/sandbox.v1.Sandbox/Exec", b->timeout * 1000 + EXEC_MARGIN_MS, shim.md,
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

/* NDJSON streaming: one JSON event per line as output arrives. */
typedef struct ndjson_s
{
  rpc_client_call_t *call;
  watch_t *watch;
  char *line;
  size_t len, off;
  bool done;
  bool failed;             /* the call ended with an error before any event */
  bool any;                /* an event has been rendered */
  grpc_status_code code;
  char *details;
} ndjson_t;

static ssize_t
ndjson_read (void *cls, uint64_t pos, char *buf, size_t max)
{
  ndjson_t *n = cls;
  while (n->off == n->len)
    {
      free (n->line);
      n->line = NULL;
      n->len = n->off = 0;
      if (n->done)
        return MHD_CONTENT_READER_END_OF_STREAM;
      ProtobufCMessage *m = NULL;
      err_t err = ERR_INIT;
      int rc = rpc_client_recv (n->call, &sandbox__v1__exec_event__descriptor, &m, &err);
      err_release (&err);
      json_t *ev = NULL;
      if (rc <= 0)
        {
          rpc_status_t st = RPC_STATUS_INIT;
          grpc_status_code code = rpc_client_finish (n->call, &st);
          n->done = true;
          if (code != GRPC_STATUS_OK && !n->any)
            {
              /* Nothing sent yet: the route answers with a proper status. */
              n->failed = true;
              n->code = code;
              n->details = st.details;
              st.details = NULL;
              rpc_status_release (&st);
              return MHD_CONTENT_READER_END_OF_STREAM;
            }
          if (code == GRPC_STATUS_OK)
            ev = NULL;
          else
            {
              metrics_gateway_error (code);
              ev = json_pack ("{s:s, s:s}", "error", rpc_status_name (code), "detail", st.details ? st.details : "");
            }
          rpc_status_release (&st);
          if (ev == NULL)
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
      else
        {
          Sandbox__V1__ExecEvent *e = (Sandbox__V1__ExecEvent *) m;
          if (e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT
              || e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDERR)
            {
              bool out = e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT;
              ProtobufCBinaryData d = out ? e->stdout : e->stderr;
              metrics_bytes (false, d.len);
              cleanup_free char *b64 = base64 (d.data, d.len);
              ev = json_pack ("{s:s}", out ? "stdout_b64" : "stderr_b64", b64 ? b64 : "");
            }
          else if (e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_EXIT && e->exit != NULL)
            {
              ev = exit_json (e->exit);
              metrics_exec_duration ((double) e->exit->duration_ms / 1000.0);
            }
          protobuf_c_message_free_unpacked (m, NULL);
        }
      if (ev != NULL)
        {
          n->any = true;
          char *text = json_dumps (ev, JSON_COMPACT);
          json_decref (ev);
          if (text != NULL && asprintf (&n->line, "%s\n", text) >= 0)
            n->len = strlen (n->line);
          free (text);
        }
    }
  size_t k = n->len - n->off < max ? n->len - n->off : max;
  memcpy (buf, n->line + n->off, k);
  n->off += k;
  return (ssize_t) k;
}

static void
ndjson_free (void *cls)
{
  ndjson_t *n = cls;
  watch_remove (n->watch);
  rpc_client_destroy (n->call);
  free (n->line);
  free (n->details);
  free (n);
}

static bool
wants_ndjson (shim_req_t *r)
{
  const char *accept = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
  return accept != NULL && strcasestr (accept, "application/x-ndjson") != NULL;
}

static struct MHD_Response *
exec_route (shim_req_t *r, unsigned *status)
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
      struct MHD_Response *out = shim_gateway_error (st.code, st.details, status);
      rpc_status_release (&st);
      return out;
    }

  if (wants_ndjson (r))
    {
      ndjson_t *n = calloc (1, sizeof *n);
      if (n == NULL)
        {
          rpc_client_destroy (c);
          return shim_detail (503, "Out of memory", status);
        }
      n->call = c;
      n->watch = watch_add (shim_req_fd (r), c);
      /* The first event decides the status: an unknown sandbox is a 404,
       * not a 200 with an error line. */
      char first;
      if (ndjson_read (n, 0, &first, 0) == MHD_CONTENT_READER_END_OF_STREAM && n->failed)
        {
          bool hung_up = watch_remove (n->watch);
          n->watch = NULL;
          struct MHD_Response *out = hung_up ? shim_detail (499, "Client closed the request", status)
                                             : shim_gateway_error (n->code, n->details, status);
          ndjson_free (n);
          return out;
        }
      /* A command may print nothing for longer than the idle timeout. */
      MHD_set_connection_option (r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0);
      struct MHD_Response *resp
          = MHD_create_response_from_callback (MHD_SIZE_UNKNOWN, 64 * 1024, ndjson_read, n, ndjson_free);
      MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-ndjson");
      *status = 200;
      return resp;
    }

  watch_t *w = watch_add (shim_req_fd (r), c);
  exec_out_t out = {0}, err_out = {0};
  json_t *result = NULL;
  for (;;)
    {
      ProtobufCMessage *m = NULL;
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
      protobuf_c_message_free_unpacked (m, NULL);
    }
  bool hung_up = watch_remove (w);
  grpc_status_code code = rpc_client_finish (c, &st);
  rpc_client_destroy (c);
  struct MHD_Response *resp;
  if (code == GRPC_STATUS_OK && result != NULL)
    {
      metrics_bytes (false, out.len + err_out.len);
      cleanup_free char *o64 = base64 (out.data, out.len);
      cleanup_free char *e64 = base64 (err_out.data, err_out.len);
      if (o64 == NULL || e64 == NULL)
        {
          json_decref (result);
          resp = shim_detail (503, "Out of memory", status);
        }
      else
        {
          json_object_set_new (result, "stdout_b64", json_string (o64));
          json_object_set_new (result, "stderr_b64", json_string (e64));
          if (out.truncated || err_out.truncated)
            json_object_set_new (result, "truncated", json_true ());
          resp = shim_json (result, 200, status);
        }
    }
  else
    {
      json_decref (result);
      if (code == GRPC_STATUS_OK)
        resp = shim_detail (502, "Gateway ended the exec without an exit status", status);
      else if (hung_up)
        resp = shim_detail (499, "Client closed the request", status);
      else
        resp = shim_gateway_error (code, st.details, status);
    }
  rpc_status_release (&st);
  free (out.data);
  free (err_out.data);
  return resp;
}

/* ---- POST /sandboxes/{id}/restore ---------------------------------------------- */

typedef struct restore_s
{
  rpc_client_call_t *call;
  bool failed;
  uint64_t sent;
} restore_t;

static int
restore_upload (shim_req_t *r, const char *data, size_t len)
{
  restore_t *s = r->state;
  if (s == NULL)
    {
      bool egress = false;
      json_t *bad = query_bool (r, "allow_egress", &egress);
      if (bad != NULL)
        {
          shim_req_fail_json (r, 422, bad);
          return -1;
        }
      s = calloc (1, sizeof *s);
      if (s == NULL)
        {
          shim_req_fail (r, 503, "Out of memory");
          return -1;
        }
      r->state = s;
      err_t err = ERR_INIT;
      Sandbox__V1__RestoreHeader h = SANDBOX__V1__RESTORE_HEADER__INIT;
      h.sandbox_id = r->id;
      h.allow_egress = egress;
      Sandbox__V1__RestoreRequest m = SANDBOX__V1__RESTORE_REQUEST__INIT;
      m.payload_case = SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_HEADER;
      m.header = &h;
      if (rpc_client_start (shim.channel, "/sandbox.v1.Sandbox/Restore", 0, shim.md, shim.n_md, &s->call, &err) < 0
          || rpc_client_send (s->call, &m.base, &err) < 0)
        s->failed = true;
      err_release (&err);
    }
  if (s->failed || len == 0)
    return s->failed ? -1 : 0;
  Sandbox__V1__RestoreRequest m = SANDBOX__V1__RESTORE_REQUEST__INIT;
  m.payload_case = SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_TAR_CHUNK;
  m.tar_chunk.data = (uint8_t *) data;
  m.tar_chunk.len = len;
  err_t err = ERR_INIT;
  if (rpc_client_send (s->call, &m.base, &err) < 0)
    s->failed = true; /* the gateway ended the call: its status says why */
  err_release (&err);
  s->sent += len;
  return s->failed ? -1 : 0;
}

static struct MHD_Response *
restore_route (shim_req_t *r, unsigned *status)
{
  restore_t *s = r->state;
  if (s == NULL || (s->sent == 0 && !s->failed))
    {
      shim_errors_t e;
      shim_errors_init (&e);
      shim_errors_add (&e, "missing", "body", NULL, "Request body is empty: a tar archive is required");
      return shim_json (shim_errors_take (&e), 422, status);
    }
  err_t err = ERR_INIT;
  if (s->call == NULL)
    return shim_detail (502, "Gateway unreachable", status);
  rpc_client_close_send (s->call, &err);
  err_release (&err);
  ProtobufCMessage *m = NULL;
  int rc = rpc_client_recv (s->call, &sandbox__v1__sandbox_info__descriptor, &m, &err);
  err_release (&err);
  if (m != NULL)
    protobuf_c_message_free_unpacked (m, NULL);
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = rpc_client_finish (s->call, &st);
  struct MHD_Response *out = code == GRPC_STATUS_OK && rc == 1
                                 ? shim_json (json_pack ("{s:s}", "sandbox_id", r->id), 201, status)
                                 : shim_gateway_error (code, st.details, status);
  rpc_status_release (&st);
  return out;
}

static void
restore_cleanup (shim_req_t *r)
{
  restore_t *s = r->state;
  if (s == NULL)
    return;
  rpc_client_destroy (s->call);
  free (s);
  r->state = NULL;
}

/* ---- GET /sandboxes/{id}/tar ----------------------------------------------------- */

typedef struct tar_s
{
  rpc_client_call_t *call;
  watch_t *watch;
  Sandbox__V1__SnapshotChunk *msg;
  size_t off;
  bool done;
} tar_t;

/* The next chunk message; 1 got one, 0 end, -1 failure. */
static int
tar_next (tar_t *t)
{
  if (t->msg != NULL)
    protobuf_c_message_free_unpacked (&t->msg->base, NULL);
  t->msg = NULL;
  t->off = 0;
  ProtobufCMessage *m = NULL;
  err_t err = ERR_INIT;
  int rc = rpc_client_recv (t->call, &sandbox__v1__snapshot_chunk__descriptor, &m, &err);
  err_release (&err);
  if (rc <= 0)
    return rc < 0 ? -1 : 0;
  t->msg = (Sandbox__V1__SnapshotChunk *) m;
  if (t->msg->last)
    t->done = true;
  return 1;
}

static ssize_t
tar_read (void *cls, uint64_t pos, char *buf, size_t max)
{
  tar_t *t = cls;
  while (t->msg == NULL || t->off == t->msg->data.len)
    {
      if (t->done)
        return MHD_CONTENT_READER_END_OF_STREAM;
      if (tar_next (t) <= 0)
        return MHD_CONTENT_READER_END_WITH_ERROR; /* cut short: the client must not take it as whole */
    }
  size_t k = t->msg->data.len - t->off < max ? t->msg->data.len - t->off : max;
  memcpy (buf, t->msg->data.data + t->off, k);
  t->off += k;
  metrics_bytes (false, k);
  return (ssize_t) k;
}

static void
tar_free (void *cls)
{
  tar_t *t = cls;
  watch_remove (t->watch);
  if (t->msg != NULL)
    protobuf_c_message_free_unpacked (&t->msg->base, NULL);
  rpc_client_destroy (t->call);
  free (t);
}

static struct MHD_Response *
tar_route (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__ExportSnapshotRequest req = SANDBOX__V1__EXPORT_SNAPSHOT_REQUEST__INIT;
  req.sandbox_id = r->id;
  tar_t *t = calloc (1, sizeof *t);
  if (t == NULL)
    return shim_detail (503, "Out of memory", status);
  err_t err = ERR_INIT;
  if (rpc_client_start (shim.channel, "/sandbox.v1.Sandbox/ExportSnapshot", 0, shim.md, shim.n_md, &t->call, &err)
          < 0
      || rpc_client_send (t->call, &req.base, &err) < 0 || rpc_client_close_send (t->call, &err) < 0
      || tar_next (t) <= 0)
    {
      /* Failed before any byte: answer with a proper status. */
      err_release (&err);
      rpc_status_t st = RPC_STATUS_INIT;
      grpc_status_code code = t->call != NULL ? rpc_client_finish (t->call, &st) : GRPC_STATUS_UNAVAILABLE;
      struct MHD_Response *out = shim_gateway_error (code, st.details, status);
      rpc_status_release (&st);
      tar_free (t);
      return out;
    }
  t->watch = watch_add (shim_req_fd (r), t->call);
  MHD_set_connection_option (r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0);
  struct MHD_Response *resp = MHD_create_response_from_callback (MHD_SIZE_UNKNOWN, 256 * 1024, tar_read, t, tar_free);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-tar");
  *status = 200;
  return resp;
}

/* ---- extensions: snapshot, connect, metrics ---------------------------------------- */

static struct MHD_Response *
snapshot_route (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__PersistSnapshotRequest req = SANDBOX__V1__PERSIST_SNAPSHOT_REQUEST__INIT;
  req.sandbox_id = r->id;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  Sandbox__V1__PersistProgress *done = NULL;
  if (rpc_client_start (shim.channel, "/sandbox.v1.Sandbox/PersistSnapshot", 0, shim.md, shim.n_md, &c, &err) == 0
      && rpc_client_send (c, &req.base, &err) == 0 && rpc_client_close_send (c, &err) == 0)
    {
      watch_t *w = watch_add (shim_req_fd (r), c);
      for (;;)
        {
          ProtobufCMessage *m = NULL;
          if (rpc_client_recv (c, &sandbox__v1__persist_progress__descriptor, &m, &err) <= 0)
            break;
          if (((Sandbox__V1__PersistProgress *) m)->done && done == NULL)
            done = (Sandbox__V1__PersistProgress *) m;
          else
            protobuf_c_message_free_unpacked (m, NULL);
        }
      watch_remove (w);
    }
  err_release (&err);
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = c != NULL ? rpc_client_finish (c, &st) : GRPC_STATUS_UNAVAILABLE;
  struct MHD_Response *out;
  if (code == GRPC_STATUS_OK && done != NULL)
    out = shim_json (json_pack ("{s:s, s:s, s:I, s:s, s:s}", "sandbox_id", r->id, "object", done->object_name, "size",
                                (json_int_t) done->bytes_written, "sha256", done->sha256, "store", done->store),
                     200, status);
  else
    out = shim_gateway_error (code == GRPC_STATUS_OK ? GRPC_STATUS_INTERNAL : code, st.details, status);
  if (done != NULL)
    protobuf_c_message_free_unpacked (&done->base, NULL);
  rpc_status_release (&st);
  rpc_client_destroy (c);
  return out;
}

static struct MHD_Response *
connect_route (shim_req_t *r, unsigned *status)
{
  bool egress = false;
  json_t *bad = query_bool (r, "allow_egress", &egress);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  Sandbox__V1__ConnectRequest req = SANDBOX__V1__CONNECT_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.allow_egress = egress;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (unary ("/sandbox.v1.Sandbox/Connect", &req.base, &sandbox__v1__connect_response__descriptor, &resp, &st,
             600000)
      == 0)
    {
      static const char *const outcomes[] = {"unspecified", "live", "restored", "created"};
      unsigned o = (unsigned) ((Sandbox__V1__ConnectResponse *) resp)->outcome;
      out = shim_json (json_pack ("{s:s, s:s}", "sandbox_id", r->id, "outcome", o < 4 ? outcomes[o] : "unspecified"),
                       200, status);
    }
  else
    out = shim_gateway_error (st.code, st.details, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

static struct MHD_Response *
metrics_route (shim_req_t *r, unsigned *status)
{
  char *text = metrics_render ();
  if (text == NULL)
    return shim_detail (503, "Out of memory", status);
  struct MHD_Response *resp = MHD_create_response_from_buffer (strlen (text), text, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
  *status = 200;
  return resp;
}

const shim_route_t shim_routes[] = {
    {"GET", "/health", SHIM_BODY_NONE, false, health, NULL, NULL},
    {"POST", "/sandboxes", SHIM_BODY_JSON, true, launch, NULL, NULL},
    {"GET", "/sandboxes", SHIM_BODY_NONE, true, list, NULL, NULL},
    {"DELETE", "/sandboxes/{id}", SHIM_BODY_NONE, true, delete, NULL, NULL},
    {"POST", "/sandboxes/{id}/exec", SHIM_BODY_JSON, true, exec_route, NULL, NULL},
    {"POST", "/sandboxes/{id}/restore", SHIM_BODY_STREAM, true, restore_route, restore_upload, restore_cleanup},
    {"GET", "/sandboxes/{id}/tar", SHIM_BODY_NONE, true, tar_route, NULL, NULL},
    {"POST", "/sandboxes/{id}/snapshot", SHIM_BODY_NONE, true, snapshot_route, NULL, NULL},
    {"POST", "/sandboxes/{id}/connect", SHIM_BODY_NONE, true, connect_route, NULL, NULL},
    {"GET", "/metrics", SHIM_BODY_NONE, true, metrics_route, NULL, NULL},
};
const size_t shim_n_routes = sizeof shim_routes / sizeof shim_routes[0];
