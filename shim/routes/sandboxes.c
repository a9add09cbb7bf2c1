/* routes/sandboxes: GET /health, POST /sandboxes, GET /sandboxes,
 * DELETE /sandboxes/{id} and GET /metrics. No state. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "grpc/health/v1/health.pb-c.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/routes/routes.h"

/* ---- GET /health -------------------------------------------------------------- */

struct MHD_Response *
route_health (shim_req_t *r, unsigned *status)
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
      if (route_unary ("/sandbox.v1.Sandbox/Status", &sreq.base, &sandbox__v1__status_response__descriptor, &resp,
                       &st, 3000)
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

/* The 201 of a launch: {"sandbox_id"}, and "allow_egress": false when
 * egress was asked for but the gateway does not allow it (the contract's
 * answer is otherwise unchanged). */
static struct MHD_Response *
launched (const shim_launch_body_t *body, const Sandbox__V1__SandboxInfo *info, unsigned *status)
{
  json_t *j = json_pack ("{s:s}", "sandbox_id", body->id);
  if (body->allow_egress && !info->allow_egress)
    {
      log_fields (SEV_WARNING, json_pack ("{s:s}", "sandbox_id", body->id),
                  "sandbox `%s` asked for egress, which the gateway does not allow (ALLOW_EGRESS): launched "
                  "without network access",
                  body->id);
      json_object_set_new (j, "allow_egress", json_false ());
    }
  return shim_json (j, 201, status);
}

struct MHD_Response *
route_launch (shim_req_t *r, unsigned *status)
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
  if (route_unary ("/sandbox.v1.Sandbox/Launch", &req.base, &sandbox__v1__sandbox_info__descriptor, &resp, &st,
                   ROUTE_SHORT_CALL_MS)
      == 0)
    out = launched (&body, (const Sandbox__V1__SandboxInfo *) resp, status);
  else if (st.code == GRPC_STATUS_ALREADY_EXISTS || st.code == GRPC_STATUS_INVALID_ARGUMENT
           || st.code == GRPC_STATUS_RESOURCE_EXHAUSTED || st.code == GRPC_STATUS_UNAUTHENTICATED
           || st.code == GRPC_STATUS_UNAVAILABLE || st.code == GRPC_STATUS_DEADLINE_EXCEEDED)
    out = shim_gateway_error (st.code, &st, status);
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

struct MHD_Response *
route_list (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__ListRequest req = SANDBOX__V1__LIST_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (route_unary ("/sandbox.v1.Sandbox/List", &req.base, &sandbox__v1__list_response__descriptor, &resp, &st,
                   ROUTE_SHORT_CALL_MS)
      == 0)
    {
      Sandbox__V1__ListResponse *l = (Sandbox__V1__ListResponse *) resp;
      json_t *arr = json_array ();
      for (size_t i = 0; i < l->n_sandboxes; i++)
        {
          Sandbox__V1__SandboxInfo *s = l->sandboxes[i];
          json_array_append_new (arr, json_pack ("{s:s, s:I, s:I, s:b, s:i, s:I, s:I}", "sandbox_id", s->sandbox_id,
                                                 "created_at_ms", (json_int_t) s->created_at_unix_ms, "last_used_ms",
                                                 (json_int_t) s->last_used_unix_ms, "allow_egress", s->allow_egress,
                                                 "process_count", (int) s->process_count, "disk_used_bytes",
                                                 (json_int_t) s->disk_used_bytes, "disk_limit_bytes",
                                                 (json_int_t) s->disk_limit_bytes));
        }
      out = shim_json (json_pack ("{s:o}", "sandboxes", arr), 200, status);
    }
  else
    out = shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

struct MHD_Response *
route_delete (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__DeleteRequest req = SANDBOX__V1__DELETE_REQUEST__INIT;
  req.sandbox_id = r->id;
  bool del_snap = false;
  json_t *bad = route_query_bool (r, "delete_snapshot", &del_snap);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  req.delete_snapshot = del_snap;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out = route_unary ("/sandbox.v1.Sandbox/Delete", &req.base,
                                          &sandbox__v1__delete_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS)
                                     == 0
                                 ? shim_empty (204, status)
                                 : shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

struct MHD_Response *
route_metrics (shim_req_t *r, unsigned *status)
{
  char *text = metrics_render ();
  if (text == NULL)
    return shim_detail (503, "Out of memory", status);
  struct MHD_Response *resp = MHD_create_response_from_buffer (strlen (text), text, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
  *status = 200;
  return resp;
}
