/* routes/common: what the REST routes share — unary gateway calls with the
 * shim's credentials, base64, boolean query parameters, and NDJSON answers
 * streamed from a gateway call. State: an NDJSON answer's, per request. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/rpc/rpc.h"
#include "shim/members.h"
#include "shim/stream.h"
#include "shim/metrics.h"
#include "shim/routes/routes.h"

int
route_unary_on (rpc_channel_t *ch, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp, rpc_status_t *st, int64_t timeout_ms)
{
  err_t err = ERR_INIT;
  int rc = rpc_client_unary (ch, method, timeout_ms, shim.md, shim.n_md, req, desc, resp, st, &err);
  err_release (&err);
  return rc;
}

int
route_unary (const char *id, const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
             ProtobufCMessage **resp, rpc_status_t *st, int64_t timeout_ms)
{
  return route_unary_on (members_route (id), method, req, desc, resp, st, timeout_ms);
}

char *
route_base64 (const uint8_t *data, size_t len)
{
  char *out = malloc (4 * ((len + 2) / 3) + 1);
  if (out != NULL)
    EVP_EncodeBlock ((unsigned char *) out, data, (int) len);
  return out;
}

/* Reads the boolean query parameter `name` into *out (unchanged when
 * absent). NULL when fine; otherwise the 422 body (the caller owns it). */
json_t *
route_query_bool (shim_req_t *r, const char *name, bool *out)
{
  const char *q = MHD_lookup_connection_value (r->conn, MHD_GET_ARGUMENT_KIND, name);
  if (q == NULL || shim_parse_bool_text (q, out) == 0)
    return NULL;
  shim_errors_t e;
  shim_errors_init (&e);
  shim_errors_add (&e, "bool_parsing", "query", name, "Input should be a valid boolean");
  return shim_errors_take (&e);
}

/* ---- NDJSON: one JSON event per line as a streaming call's messages arrive ---- */

typedef struct ndjson_s
{
  rpc_client_call_t *call;
  const ProtobufCMessageDescriptor *desc;
  route_event_fn event;
  void *ctx; /* the events' state, owned */
  hangup_t *hangup;
  char *line;
  size_t len, off;
  bool done;
  bool failed;     /* the call ended with an error before any message */
  bool any;        /* a message has arrived */
  rpc_status_t st; /* the call's status when failed */
} ndjson_t;

/* The call's end: nothing more, or an error line when it failed after a
 * message (before one, the route answers with a proper status instead). */
static json_t *
ndjson_end (ndjson_t *n)
{
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = rpc_client_finish (n->call, &st);
  n->done = true;
  json_t *ev = NULL;
  if (code != GRPC_STATUS_OK && !n->any)
    {
      n->failed = true;
      n->st = st; /* moved */
      return NULL;
    }
  if (code != GRPC_STATUS_OK)
    {
      metrics_gateway_error (code);
      ev = json_pack ("{s:s, s:s}", "error", rpc_status_name (code), "detail", st.details ? st.details : "");
    }
  rpc_status_release (&st);
  return ev;
}

/* Receives the next message into n->line (empty when it renders nothing). */
static void
ndjson_next (ndjson_t *n)
{
  free (n->line);
  n->line = NULL;
  n->len = n->off = 0;
  ProtobufCMessage *m = NULL;
  err_t err = ERR_INIT;
  int rc = rpc_client_recv (n->call, n->desc, &m, &err);
  err_release (&err);
  json_t *ev;
  if (rc <= 0)
    ev = ndjson_end (n);
  else
    {
      n->any = true;
      ev = n->event (m, n->ctx);
      protobuf_c_message_free_unpacked (m, NULL);
    }
  if (ev == NULL)
    return;
  char *text = json_dumps (ev, JSON_COMPACT);
  json_decref (ev);
  if (text != NULL && asprintf (&n->line, "%s\n", text) >= 0)
    n->len = strlen (n->line);
  free (text);
}

static ssize_t
ndjson_read (void *cls, uint64_t pos, char *buf, size_t max)
{
  ndjson_t *n = cls;
  while (n->off == n->len)
    {
      if (n->done)
        return MHD_CONTENT_READER_END_OF_STREAM;
      ndjson_next (n);
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
  hangup_remove (n->hangup);
  rpc_client_destroy (n->call);
  free (n->line);
  rpc_status_release (&n->st);
  free (n->ctx);
  free (n);
}

struct MHD_Response *
route_ndjson (shim_req_t *r, rpc_client_call_t *c, const ProtobufCMessageDescriptor *desc, route_event_fn event,
              void *ctx, route_error_fn error, unsigned *status)
{
  ndjson_t *n = calloc (1, sizeof *n);
  if (n == NULL)
    {
      rpc_client_destroy (c);
      free (ctx);
      return shim_detail (503, "Out of memory", status);
    }
  n->call = c;
  n->desc = desc;
  n->event = event;
  n->ctx = ctx;
  n->hangup = hangup_add (shim_req_fd (r), c);
  /* The first message decides the status: an unknown sandbox is a 404,
   * not a 200 with an error line. */
  ndjson_next (n);
  if (n->failed)
    {
      bool hung_up = hangup_remove (n->hangup);
      n->hangup = NULL;
      struct MHD_Response *out
          = hung_up ? shim_detail (499, "Client closed the request", status) : error (n->st.code, &n->st, status);
      ndjson_free (n);
      return out;
    }
  /* A command may print nothing for longer than the idle timeout. */
  MHD_set_connection_option (r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0);
  struct MHD_Response *resp = shim_stream_response (r, MHD_SIZE_UNKNOWN, 64 * 1024, ndjson_read, n, ndjson_free);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-ndjson");
  *status = 200;
  return resp;
}

rpc_client_call_t *
route_call_open (const char *id, const char *method, int64_t timeout_ms, const ProtobufCMessage *first,
                 const ProtobufCMessage *const *rest, size_t n, bool half_close, rpc_status_t *st)
{
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  int rc = rpc_client_start (members_route (id), method, timeout_ms, shim.md, shim.n_md, &c, &err);
  if (rc == 0)
    rc = rpc_client_send (c, first, &err);
  for (size_t i = 0; rc == 0 && i < n; i++)
    rc = rpc_client_send (c, rest[i], &err);
  if (rc == 0 && half_close)
    rc = rpc_client_close_send (c, &err);
  if (rc == 0)
    {
      err_release (&err);
      return c;
    }
  if (c != NULL)
    {
      /* The gateway ended the call: its status says why. */
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

json_t *
route_output_json (bool stdout_, ProtobufCBinaryData d)
{
  metrics_bytes (false, d.len);
  cleanup_free char *b64 = route_base64 (d.data, d.len);
  return json_pack ("{s:s}", stdout_ ? "stdout_b64" : "stderr_b64", b64 ? b64 : "");
}

json_t *
route_exit_code_json (const Sandbox__V1__ExitStatus *x)
{
  if (x->timed_out)
    return json_null ();
  if (x->signal != 0)
    return json_integer (-(json_int_t) x->signal);
  return json_integer (x->exit_code);
}

json_t *
route_exit_signal_json (const Sandbox__V1__ExitStatus *x)
{
  return x->signal != 0 ? json_integer (x->signal) : json_null ();
}
