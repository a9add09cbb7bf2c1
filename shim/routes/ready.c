/* routes/ready: GET /ready, the readiness probe beside /health.
 *
 * /health answers 200 whenever the shim runs (the contract's liveness
 * check, with what it knows in its body). /ready answers 200 only when
 * traffic sent now could succeed: the gateway is reachable, reports
 * SERVING (grpc.health.v1 Check), and accepts the shim's credentials (an
 * authenticated sandbox.v1.Sandbox/Status). Otherwise 503 with the reason
 * in "detail". No auth, like /health. With SHIM_GATEWAYS, ready when one
 * gateway of the set is: the ids of those that are down go to the others.
 *
 * A verdict is reused for READY_CACHE_MS (routes/reuse.h), so probes from
 * many replicas, a tight period or a flood cost the gateway one check per
 * interval; probes during a check take the last verdict at once instead of
 * holding a worker while they wait for it.
 */
#include <stdio.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/members.h"
#include "shim/routes/reuse.h"
#include "shim/routes/routes.h"

/* How long a verdict is reused. */
#define READY_CACHE_MS 1000
/* Deadline of each of the two checks. */
#define READY_CALL_MS 2000

typedef struct verdict_s
{
  bool ok;
  char reason[512];
} verdict_t;

static verdict_t ready_last;
static shim_reuse_t ready_reuse = SHIM_REUSE_INIT (READY_CACHE_MS, ready_last);

/* Why a gateway call failed, for the reason text. */
static void
describe_failure (const char *what, const rpc_status_t *st, char *buf, size_t cap)
{
  const char *d = st->details != NULL && st->details[0] != '\0' ? st->details : rpc_status_name (st->code);
  if ((st->code == GRPC_STATUS_UNAVAILABLE && !st->from_handler) || st->code == GRPC_STATUS_DEADLINE_EXCEEDED)
    snprintf (buf, cap, "Gateway unreachable (%s): %.300s", rpc_status_name (st->code), d);
  else if (st->code == GRPC_STATUS_UNAUTHENTICATED || st->code == GRPC_STATUS_PERMISSION_DENIED)
    snprintf (buf, cap, "Gateway rejects the shim's secret (%s): check SHIM_GATEWAY_SECRET",
              rpc_status_name (st->code));
  else if (st->code == GRPC_STATUS_UNAVAILABLE)
    /* The gateway itself said unavailable: no secret configured, or
     * shutting down; its message says which. */
    snprintf (buf, cap, "Gateway unavailable (UNAVAILABLE): %.300s", d);
  else
    snprintf (buf, cap, "Gateway %s failed (%s): %.300s", what, rpc_status_name (st->code), d);
}

/* grpc.health.v1 Check of the sandbox service: true when SERVING. */
static bool
check_serving (rpc_channel_t *ch, char *reason, size_t cap)
{
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = "sandbox.v1.Sandbox";
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  err_t err = ERR_INIT;
  bool ok = false;
  if (rpc_client_unary (ch, "/grpc.health.v1.Health/Check", READY_CALL_MS, NULL, 0, &req.base,
                        &grpc__health__v1__health_check_response__descriptor, &resp, &st, &err)
      < 0)
    describe_failure ("health check", &st, reason, cap);
  else if (((Grpc__Health__V1__HealthCheckResponse *) resp)->status
           != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
    snprintf (reason, cap, "Gateway not serving (health NOT_SERVING: shutting down)");
  else
    ok = true;
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  err_release (&err);
  return ok;
}

/* An authenticated Status call: true when the gateway accepts the shim. */
static bool
check_accepted (rpc_channel_t *ch, char *reason, size_t cap)
{
  if (shim.n_md == 0)
    {
      snprintf (reason, cap,
                "The shim has no secret for the gateway (SHIM_GATEWAY_SECRET and CLOUD_RUN_SANDBOX_GATEWAY_SECRET "
                "are unset)");
      return false;
    }
  Sandbox__V1__StatusRequest req = SANDBOX__V1__STATUS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  bool ok = route_unary_on (ch, "/sandbox.v1.Sandbox/Status", &req.base, &sandbox__v1__status_response__descriptor,
                            &resp, &st, READY_CALL_MS)
            == 0;
  if (!ok)
    describe_failure ("status call", &st, reason, cap);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  rpc_status_release (&st);
  return ok;
}

/* Ready when one gateway of the set is (the only one, without
 * SHIM_GATEWAYS); the reason names the last one that is not. */
static bool
check_members (char *reason, size_t cap)
{
  rpc_channel_t *chs[MEMBERS_MAX];
  const char *names[MEMBERS_MAX];
  size_t n = members_serving (chs, names, MEMBERS_MAX);
  snprintf (reason, cap, "No gateway of SHIM_GATEWAYS is up (see the shim's log and shim_gateway_up in /metrics)");
  for (size_t i = 0; i < n; i++)
    {
      char why[sizeof ready_last.reason];
      if (check_serving (chs[i], why, sizeof why) && check_accepted (chs[i], why, sizeof why))
        return true;
      if (members_routing ())
        snprintf (reason, cap, "gateway `%.100s`: %.380s", names[i], why);
      else
        memcpy (reason, why, cap < sizeof why ? cap : sizeof why);
    }
  return false;
}

static void
ready_ask (void *answer)
{
  verdict_t *v = answer;
  v->ok = check_members (v->reason, sizeof v->reason);
}

struct MHD_Response *
route_ready (shim_req_t *r, unsigned *status)
{
  (void) r;
  verdict_t v;
  shim_reuse (&ready_reuse, ready_ask, &v);
  if (v.ok)
    return shim_json (json_pack ("{s:b}", "ready", true), 200, status);
  return shim_detail (503, v.reason, status);
}
