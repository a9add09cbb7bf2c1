/* routes/snapshots: POST /sandboxes/{id}/restore (the body streamed to the
 * gateway as it arrives), GET /sandboxes/{id}/tar (streamed back), and the
 * extensions POST /sandboxes/{id}/snapshot and /connect. State: per
 * request. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/stream.h"
#include "shim/members.h"
#include "shim/routes/routes.h"

/* The longest a Connect may take (it may restore a large snapshot from the
 * store): past it the call is cancelled, and the miss logged. */
#define SHIM_CONNECT_DEADLINE_MS (10 * 60 * 1000)

/* ---- POST /sandboxes/{id}/restore ---------------------------------------------- */

typedef struct restore_s
{
  rpc_client_call_t *call;
  bool failed;
  bool egress; /* asked for */
  uint64_t sent;
} restore_t;

int
route_restore_upload (shim_req_t *r, const char *data, size_t len)
{
  restore_t *s = r->state;
  if (s == NULL)
    {
      bool egress = false;
      json_t *bad = route_query_bool (r, "allow_egress", &egress);
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
      s->egress = egress;
      err_t err = ERR_INIT;
      Sandbox__V1__RestoreHeader h = SANDBOX__V1__RESTORE_HEADER__INIT;
      h.sandbox_id = r->id;
      h.allow_egress = egress;
      Sandbox__V1__RestoreRequest m = SANDBOX__V1__RESTORE_REQUEST__INIT;
      m.payload_case = SANDBOX__V1__RESTORE_REQUEST__PAYLOAD_HEADER;
      m.header = &h;
      if (rpc_client_start (members_route (r->id), "/sandbox.v1.Sandbox/Restore", 0, shim.md, shim.n_md, &s->call,
                            &err)
              < 0
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

struct MHD_Response *
route_restore (shim_req_t *r, unsigned *status)
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
  /* As a launch answers: "allow_egress": false when egress was asked for
   * but the gateway does not allow it. */
  bool refused = s->egress && m != NULL && !((Sandbox__V1__SandboxInfo *) m)->allow_egress;
  if (m != NULL)
    protobuf_c_message_free_unpacked (m, NULL);
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = rpc_client_finish (s->call, &st);
  struct MHD_Response *out;
  if (code == GRPC_STATUS_OK && rc == 1)
    {
      json_t *j = json_pack ("{s:s}", "sandbox_id", r->id);
      if (refused)
        {
          log_fields (SEV_WARNING, json_pack ("{s:s}", "sandbox_id", r->id),
                      "sandbox `%s` asked for egress, which the gateway does not allow (ALLOW_EGRESS): restored "
                      "without network access",
                      r->id);
          json_object_set_new (j, "allow_egress", json_false ());
        }
      out = shim_json (j, 201, status);
    }
  else
    out = shim_gateway_error (code, &st, status);
  rpc_status_release (&st);
  return out;
}

void
route_restore_cleanup (shim_req_t *r)
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
  hangup_t *hangup;
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
  hangup_remove (t->hangup);
  if (t->msg != NULL)
    protobuf_c_message_free_unpacked (&t->msg->base, NULL);
  rpc_client_destroy (t->call);
  free (t);
}

struct MHD_Response *
route_tar (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__ExportSnapshotRequest req = SANDBOX__V1__EXPORT_SNAPSHOT_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.skip_sha256 = true; /* the REST answer has nowhere to carry it */
  tar_t *t = calloc (1, sizeof *t);
  if (t == NULL)
    return shim_detail (503, "Out of memory", status);
  err_t err = ERR_INIT;
  if (rpc_client_start (members_route (r->id), "/sandbox.v1.Sandbox/ExportSnapshot", 0, shim.md, shim.n_md, &t->call,
                        &err)
          < 0
      || rpc_client_send (t->call, &req.base, &err) < 0 || rpc_client_close_send (t->call, &err) < 0
      || tar_next (t) <= 0)
    {
      /* Failed before any byte: answer with a proper status. */
      err_release (&err);
      rpc_status_t st = RPC_STATUS_INIT;
      grpc_status_code code = t->call != NULL ? rpc_client_finish (t->call, &st) : GRPC_STATUS_UNAVAILABLE;
      struct MHD_Response *out = shim_gateway_error (code, &st, status);
      rpc_status_release (&st);
      tar_free (t);
      return out;
    }
  t->hangup = hangup_add (shim_req_fd (r), t->call);
  MHD_set_connection_option (r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0);
  struct MHD_Response *resp = shim_stream_response (r, MHD_SIZE_UNKNOWN, 256 * 1024, tar_read, t, tar_free);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-tar");
  *status = 200;
  return resp;
}

/* ---- extensions: snapshot, connect, metrics ---------------------------------------- */

/* Logs a Connect of `id` that ran into SHIM_CONNECT_DEADLINE_MS. */
static void
connect_deadline_check (const char *id, const rpc_status_t *st)
{
  if (st->code == GRPC_STATUS_DEADLINE_EXCEEDED)
    log_msg (SEV_WARNING, "Connect of sandbox `%s` cut at its deadline of %d s", id, SHIM_CONNECT_DEADLINE_MS / 1000);
}

struct MHD_Response *
route_snapshot (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__PersistSnapshotRequest req = SANDBOX__V1__PERSIST_SNAPSHOT_REQUEST__INIT;
  req.sandbox_id = r->id;
  err_t err = ERR_INIT;
  rpc_client_call_t *c = NULL;
  Sandbox__V1__PersistProgress *done = NULL;
  if (rpc_client_start (members_route (r->id), "/sandbox.v1.Sandbox/PersistSnapshot", 0, shim.md, shim.n_md, &c, &err)
          == 0
      && rpc_client_send (c, &req.base, &err) == 0 && rpc_client_close_send (c, &err) == 0)
    {
      hangup_t *w = hangup_add (shim_req_fd (r), c);
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
      hangup_remove (w);
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
    out = shim_gateway_error (code == GRPC_STATUS_OK ? GRPC_STATUS_INTERNAL : code, &st, status);
  if (done != NULL)
    protobuf_c_message_free_unpacked (&done->base, NULL);
  rpc_status_release (&st);
  rpc_client_destroy (c);
  return out;
}

struct MHD_Response *
route_connect (shim_req_t *r, unsigned *status)
{
  bool egress = false;
  json_t *bad = route_query_bool (r, "allow_egress", &egress);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  Sandbox__V1__ConnectRequest req = SANDBOX__V1__CONNECT_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.allow_egress = egress;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (route_unary (r->id, "/sandbox.v1.Sandbox/Connect", &req.base, &sandbox__v1__connect_response__descriptor, &resp,
                   &st, SHIM_CONNECT_DEADLINE_MS)
      == 0)
    {
      static const char *const outcomes[] = {"unspecified", "live", "restored", "created"};
      unsigned o = (unsigned) ((Sandbox__V1__ConnectResponse *) resp)->outcome;
      out = shim_json (json_pack ("{s:s, s:s}", "sandbox_id", r->id, "outcome", o < 4 ? outcomes[o] : "unspecified"),
                       200, status);
    }
  else
    {
      connect_deadline_check (r->id, &st);
      out = shim_gateway_error (st.code, &st, status);
    }
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

/* SHIM_RESTORE_ON_MISS (server.c): has `id`'s owner restore it from the
 * store, without egress (a caller that needs egress connects itself with
 * allow_egress). True when it did (or another call made it live
 * meanwhile); false when the store has no snapshot or the call failed. */
bool
route_restore_missing (const char *id)
{
  Sandbox__V1__ConnectRequest req = SANDBOX__V1__CONNECT_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  req.restore_only = true;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int64_t t0 = shim_mono_ns ();
  bool ok = route_unary (id, "/sandbox.v1.Sandbox/Connect", &req.base, &sandbox__v1__connect_response__descriptor,
                         &resp, &st, SHIM_CONNECT_DEADLINE_MS)
            == 0;
  connect_deadline_check (id, &st);
  const char *outcome = ok ? "restored" : st.code == GRPC_STATUS_NOT_FOUND ? "absent" : "failed";
  metrics_restore_on_miss (outcome);
  log_fields (ok                                 ? SEV_INFO
              : st.code == GRPC_STATUS_NOT_FOUND ? SEV_DEBUG
                                                 : SEV_WARNING,
              json_pack ("{s:s, s:s, s:f}", "sandbox_id", id, "outcome", outcome, "seconds",
                         (double) (shim_mono_ns () - t0) / 1e9),
              ok ? "sandbox `%s` restored on its gateway from the store (SHIM_RESTORE_ON_MISS)"
                 : "sandbox `%s` not restored on miss: %s",
              id,
              ok                   ? ""
              : st.details != NULL ? st.details
                                   : rpc_status_name (st.code));
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return ok;
}
