/* routes/sandboxes: GET /health, POST /sandboxes, GET /sandboxes,
 * GET /sandboxes/{id}, POST /sandboxes/{id}/extend, DELETE /sandboxes/{id}
 * and GET /metrics. State: the last /health answer, under its lock. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "grpc/health/v1/health.pb-c.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/members.h"
#include "shim/metrics.h"
#include "shim/routes/reuse.h"
#include "shim/routes/routes.h"

/* ---- GET /health -------------------------------------------------------------- */

/* Whether the gateway of `ch` answers and its health says SERVING (its
 * sandbox runtime passes its self-check): the seed's meaning of
 * cli_mounted. Whether it also accepts this shim's credentials is /ready's
 * question, not /health's. Then whether it allows egress (from an
 * authenticated Status; false when that is refused). */
static bool
serving (rpc_channel_t *ch, bool *egress)
{
  Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  hreq.service = "sandbox.v1.Sandbox";
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  err_t err = ERR_INIT;
  bool ok = rpc_client_unary (ch, "/grpc.health.v1.Health/Check", 3000, NULL, 0, &hreq.base,
                              &grpc__health__v1__health_check_response__descriptor, &resp, &st, &err)
                == 0
            && ((Grpc__Health__V1__HealthCheckResponse *) resp)->status
                   == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  resp = NULL;
  rpc_status_release (&st);
  err_release (&err);
  *egress = false;
  if (ok)
    {
      Sandbox__V1__StatusRequest sreq = SANDBOX__V1__STATUS_REQUEST__INIT;
      if (route_unary_on (ch, "/sandbox.v1.Sandbox/Status", &sreq.base, &sandbox__v1__status_response__descriptor,
                          &resp, &st, 3000)
          == 0)
        {
          *egress = ((Sandbox__V1__StatusResponse *) resp)->allow_egress;
          protobuf_c_message_free_unpacked (resp, NULL);
        }
      rpc_status_release (&st);
    }
  return ok;
}

/* How long an answer of /health is reused (routes/reuse.h). */
#define HEALTH_REUSE_MS 1000

typedef struct health_s
{
  bool ok, egress;
} health_t;

static health_t health_last;
static shim_reuse_t health_reuse = SHIM_REUSE_INIT (HEALTH_REUSE_MS, health_last);

static void
health_ask (void *answer)
{
  health_t *h = answer;
  rpc_channel_t *chs[MEMBERS_MAX];
  const char *names[MEMBERS_MAX];
  size_t n = members_serving (chs, names, MEMBERS_MAX);
  h->ok = h->egress = false;
  for (size_t i = 0; i < n && !h->ok; i++)
    h->ok = serving (chs[i], &h->egress);
}

/* {"cli_mounted": a gateway answers and serves, "allow_egress": it allows
 * egress}; with SHIM_GATEWAYS, the first gateway of the set that serves. */
struct MHD_Response *
route_health (shim_req_t *r, unsigned *status)
{
  (void) r;
  health_t h;
  shim_reuse (&health_reuse, health_ask, &h);
  return shim_json (json_pack ("{s:b, s:b}", "cli_mounted", h.ok, "allow_egress", h.egress), 200, status);
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
  req.image = body.image;
  Sandbox__V1__Resources res = SANDBOX__V1__RESOURCES__INIT;
  res.memory_mb = (uint32_t) body.memory_mb;
  res.cpus = body.cpus;
  res.disk_mb = (uint32_t) body.disk_mb;
  res.pids_max = (uint32_t) body.pids_max;
  req.resources = &res;
  req.idle_ttl_seconds = (uint32_t) body.idle_ttl;
  req.max_lifetime_seconds = (uint32_t) body.max_lifetime;
  Sandbox__V1__LaunchRequest__EnvEntry env[SHIM_LAUNCH_ENV_MAX], *envp[SHIM_LAUNCH_ENV_MAX];
  Sandbox__V1__LaunchRequest__LabelsEntry lbl[SHIM_LAUNCH_LABELS_MAX], *lblp[SHIM_LAUNCH_LABELS_MAX];
  const char *k;
  json_t *v;
  json_object_foreach (body.env, k, v)
  {
    sandbox__v1__launch_request__env_entry__init (&env[req.n_env]);
    env[req.n_env].key = (char *) k;
    env[req.n_env].value = (char *) json_string_value (v);
    envp[req.n_env] = &env[req.n_env];
    req.n_env++;
  }
  json_object_foreach (body.labels, k, v)
  {
    sandbox__v1__launch_request__labels_entry__init (&lbl[req.n_labels]);
    lbl[req.n_labels].key = (char *) k;
    lbl[req.n_labels].value = (char *) json_string_value (v);
    lblp[req.n_labels] = &lbl[req.n_labels];
    req.n_labels++;
  }
  req.env = envp;
  req.labels = lblp;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out;
  if (route_unary (body.id, "/sandbox.v1.Sandbox/Launch", &req.base, &sandbox__v1__sandbox_info__descriptor, &resp,
                   &st, body.image[0] != '\0' ? ROUTE_IMAGE_LAUNCH_MS : ROUTE_SHORT_CALL_MS)
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
  shim_launch_body_release (&body);
  return out;
}

/* One sandbox of a List answer as the REST object. */
static json_t *
sandbox_json (const Sandbox__V1__SandboxInfo *s)
{
  json_t *j = json_pack ("{s:s, s:I, s:I, s:b, s:i, s:I, s:I}", "sandbox_id", s->sandbox_id, "created_at_ms",
                         (json_int_t) s->created_at_unix_ms, "last_used_ms", (json_int_t) s->last_used_unix_ms,
                         "allow_egress", s->allow_egress, "process_count", (int) s->process_count, "disk_used_bytes",
                         (json_int_t) s->disk_used_bytes, "disk_limit_bytes", (json_int_t) s->disk_limit_bytes);
  /* Additive: its labels and when it expires (0: never). */
  json_t *labels = json_object ();
  for (size_t i = 0; i < s->n_labels; i++)
    json_object_set_new (labels, s->labels[i]->key, json_string (s->labels[i]->value));
  json_object_set_new (j, "labels", labels);
  json_object_set_new (j, "expires_at_ms", json_integer ((json_int_t) s->expires_at_unix_ms));
  return j;
}

/* GET /sandboxes: every gateway of the set is asked (one: as the contract
 * has it), the answers merged. A gateway that fails is left out and
 * logged, unless all fail: then the last failure answers. With several,
 * each gets ROUTE_FANOUT_CALL_MS: a gateway that hangs, before its health
 * check finds it down, holds the list that long, not a minute. An id held by
 * two gateways (one that came back after its ids had been restored
 * elsewhere) is listed once. */
struct MHD_Response *
route_list (shim_req_t *r, unsigned *status)
{
  /* ?labels=<selector>: checked here, then passed to every gateway. */
  const char *selector = MHD_lookup_connection_value (r->conn, MHD_GET_ARGUMENT_KIND, "labels");
  shim_errors_t e;
  shim_errors_init (&e);
  if (selector != NULL && !shim_check_selector (selector, &e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);
  rpc_channel_t *chs[MEMBERS_MAX];
  const char *names[MEMBERS_MAX];
  size_t n = members_serving (chs, names, MEMBERS_MAX);
  json_t *arr = json_array ();
  json_t *seen = json_object ();
  rpc_status_t st = RPC_STATUS_INIT;
  size_t answered = 0;
  for (size_t i = 0; i < n; i++)
    {
      Sandbox__V1__ListRequest req = SANDBOX__V1__LIST_REQUEST__INIT;
      req.label_selector = (char *) (selector != NULL ? selector : "");
      ProtobufCMessage *resp = NULL;
      rpc_status_release (&st);
      if (route_unary_on (chs[i], "/sandbox.v1.Sandbox/List", &req.base, &sandbox__v1__list_response__descriptor,
                          &resp, &st, members_routing () ? ROUTE_FANOUT_CALL_MS : ROUTE_SHORT_CALL_MS)
          < 0)
        {
          if (members_routing ())
            log_fields (SEV_WARNING, json_pack ("{s:s, s:s}", "gateway", names[i], "code", rpc_status_name (st.code)),
                        "list: gateway `%s` left out: %s", names[i], st.details != NULL ? st.details : "");
          continue;
        }
      answered++;
      Sandbox__V1__ListResponse *l = (Sandbox__V1__ListResponse *) resp;
      for (size_t k = 0; k < l->n_sandboxes; k++)
        if (json_object_get (seen, l->sandboxes[k]->sandbox_id) == NULL)
          {
            json_object_set_new (seen, l->sandboxes[k]->sandbox_id, json_true ());
            json_array_append_new (arr, sandbox_json (l->sandboxes[k]));
          }
      protobuf_c_message_free_unpacked (resp, NULL);
    }
  json_decref (seen);
  struct MHD_Response *out;
  if (answered > 0)
    out = shim_json (json_pack ("{s:o}", "sandboxes", arr), 200, status);
  else if (n == 0)
    {
      json_decref (arr);
      out = shim_detail (502, "No gateway of the set is up", status);
    }
  else
    {
      json_decref (arr);
      out = shim_gateway_error (st.code, &st, status);
    }
  rpc_status_release (&st);
  return out;
}

struct MHD_Response *
route_get (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__GetRequest req = SANDBOX__V1__GET_REQUEST__INIT;
  req.sandbox_id = r->id;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out = route_unary (r->id, "/sandbox.v1.Sandbox/Get", &req.base,
                                          &sandbox__v1__sandbox_info__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS)
                                     == 0
                                 ? shim_json (sandbox_json ((const Sandbox__V1__SandboxInfo *) resp), 200, status)
                                 : shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

/* POST /sandboxes/{id}/extend {"idle_ttl", "max_lifetime"}: the sandbox
 * as GET /sandboxes/{id} shows it. */
struct MHD_Response *
route_extend (shim_req_t *r, unsigned *status)
{
  shim_errors_t e;
  shim_errors_init (&e);
  shim_extend_body_t body;
  const char *ct = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!shim_parse_extend (ct, r->body, r->len, &body, &e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);
  Sandbox__V1__ExtendRequest req = SANDBOX__V1__EXTEND_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.idle_ttl_seconds = (uint32_t) body.idle_ttl;
  req.max_lifetime_seconds = (uint32_t) body.max_lifetime;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  struct MHD_Response *out = route_unary (r->id, "/sandbox.v1.Sandbox/Extend", &req.base,
                                          &sandbox__v1__sandbox_info__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS)
                                     == 0
                                 ? shim_json (sandbox_json ((const Sandbox__V1__SandboxInfo *) resp), 200, status)
                                 : shim_gateway_error (st.code, &st, status);
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
  struct MHD_Response *out = route_unary (r->id, "/sandbox.v1.Sandbox/Delete", &req.base,
                                          &sandbox__v1__delete_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS)
                                     == 0
                                 ? shim_empty (204, status)
                                 : shim_gateway_error (st.code, &st, status);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return out;
}

/* The gateways' own figures (Status of each one not down), after the
 * shim's: live sandboxes, the limit and the name, per gateway. */
static void
render_gateways (FILE *f)
{
  rpc_channel_t *chs[MEMBERS_MAX];
  const char *names[MEMBERS_MAX];
  Sandbox__V1__StatusResponse *st[MEMBERS_MAX];
  size_t n = members_serving (chs, names, MEMBERS_MAX);
  for (size_t i = 0; i < n; i++)
    {
      Sandbox__V1__StatusRequest req = SANDBOX__V1__STATUS_REQUEST__INIT;
      ProtobufCMessage *resp = NULL;
      rpc_status_t rs = RPC_STATUS_INIT;
      st[i] = route_unary_on (chs[i], "/sandbox.v1.Sandbox/Status", &req.base,
                              &sandbox__v1__status_response__descriptor, &resp, &rs, 2000)
                      == 0
                  ? (Sandbox__V1__StatusResponse *) resp
                  : NULL;
      rpc_status_release (&rs);
    }
  fputs ("# HELP shim_gateway_sandboxes Live sandboxes of each gateway (its Status).\n"
         "# TYPE shim_gateway_sandboxes gauge\n",
         f);
  for (size_t i = 0; i < n; i++)
    if (st[i] != NULL)
      fprintf (f, "shim_gateway_sandboxes{gateway=\"%s\"} %u\n", names[i], st[i]->sandboxes);
  fputs ("# HELP shim_gateway_max_sandboxes Most live sandboxes of each gateway (SANDBOX_MAX).\n"
         "# TYPE shim_gateway_max_sandboxes gauge\n",
         f);
  for (size_t i = 0; i < n; i++)
    if (st[i] != NULL)
      fprintf (f, "shim_gateway_max_sandboxes{gateway=\"%s\"} %u\n", names[i], st[i]->max_sandboxes);
  fputs ("# HELP shim_gateway_info The name each gateway gives itself (Status: SANDBOX_GATEWAY_NAME).\n"
         "# TYPE shim_gateway_info gauge\n",
         f);
  for (size_t i = 0; i < n; i++)
    if (st[i] != NULL)
      {
        /* A name is printable ASCII without spaces (the gateway checks);
         * quotes and backslashes are escaped all the same. */
        fprintf (f, "shim_gateway_info{gateway=\"%s\",name=\"", names[i]);
        for (const char *c = st[i]->gateway_name != NULL ? st[i]->gateway_name : ""; *c != '\0'; c++)
          fprintf (f, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
        fputs ("\"} 1\n", f);
        protobuf_c_message_free_unpacked (&st[i]->base, NULL);
      }
}

struct MHD_Response *
route_metrics (shim_req_t *r, unsigned *status)
{
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream (&text, &len);
  if (f == NULL)
    return shim_detail (503, "Out of memory", status);
  metrics_render (f);
  members_render_metrics (f);
  render_gateways (f);
  if (fclose (f) != 0 || text == NULL)
    {
      free (text);
      return shim_detail (503, "Out of memory", status);
    }
  struct MHD_Response *resp = MHD_create_response_from_buffer (len, text, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
  *status = 200;
  return resp;
}
