/* response: the shim's answers — JSON bodies, {"detail": ...} errors,
 * early refusals — and the one table that maps a failed gateway call
 * (its gRPC status) to an HTTP status. No state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim/metrics.h"
#include "shim/shim.h"

struct MHD_Response *
shim_json (json_t *body, unsigned code, unsigned *status)
{
  char *text = json_dumps (body, JSON_COMPACT);
  json_decref (body);
  if (text == NULL)
    text = strdup ("{\"detail\":\"Internal Server Error\"}");
  struct MHD_Response *resp = MHD_create_response_from_buffer (strlen (text), text, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  *status = code;
  return resp;
}

struct MHD_Response *
shim_detail (unsigned code, const char *detail, unsigned *status)
{
  json_t *d = json_string (detail);
  if (d == NULL)
    d = json_string ("(detail not valid UTF-8)");
  return shim_json (json_pack ("{s:o}", "detail", d), code, status);
}

struct MHD_Response *
shim_empty (unsigned code, unsigned *status)
{
  *status = code;
  return MHD_create_response_from_buffer (0, (void *) "", MHD_RESPMEM_PERSISTENT);
}

void
shim_req_fail_json (shim_req_t *r, unsigned code, json_t *body)
{
  if (r->early != NULL)
    {
      json_decref (body);
      return;
    }
  r->early = shim_json (body, code, &r->early_status);
  r->discard = true;
}

void
shim_req_fail (shim_req_t *r, unsigned code, const char *detail)
{
  if (r->early != NULL)
    return;
  r->early = shim_detail (code, detail, &r->early_status);
  r->discard = true;
}

/* Whether the last gateway error answered on this thread was its owner
 * saying it does not hold the call's sandbox: see shim_missed. */
static __thread bool missed;

/* Notes a gateway's "no such sandbox": NOT_FOUND from its handler with the
 * reason ERR_REASON_SANDBOX_NOT_FOUND (the message is for people and is
 * not read). */
static void
note_missing (grpc_status_code code, const rpc_status_t *st)
{
  missed = code == GRPC_STATUS_NOT_FOUND && st != NULL && st->from_handler
           && strcmp (st->reason, ERR_REASON_SANDBOX_NOT_FOUND) == 0;
}

void
shim_missed_reset (void)
{
  missed = false;
}

bool
shim_missed (void)
{
  return missed;
}

/* The one mapping of gateway statuses to HTTP statuses. */
unsigned
shim_http_status (grpc_status_code code, bool from_handler)
{
  switch (code)
    {
    case GRPC_STATUS_NOT_FOUND: return 404;
    case GRPC_STATUS_ALREADY_EXISTS: return 409;
    case GRPC_STATUS_INVALID_ARGUMENT: return 422;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return 429;
    /* The request is fine but the thing is in the wrong state for it (a
     * process that has exited or closed its stdin). */
    case GRPC_STATUS_FAILED_PRECONDITION: return 409;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return 504;
    /* The gateway answering "unavailable" (shutting down, no secret: its
     * handler layer marks the status) is not the same as no gateway at all
     * (refused, reset, gone). */
    case GRPC_STATUS_UNAVAILABLE: return from_handler ? 503 : 502;
    default: return 502;
    }
}

struct MHD_Response *
shim_gateway_error (grpc_status_code code, const rpc_status_t *st, unsigned *status)
{
  metrics_gateway_error (code);
  note_missing (code, st);
  const char *details = st != NULL ? st->details : NULL;
  const char *d = details != NULL && details[0] != '\0' ? details : rpc_status_name (code);
  unsigned http = shim_http_status (code, st != NULL && st->from_handler);
  char buf[1200];
  switch (code)
    {
    case GRPC_STATUS_NOT_FOUND: return shim_detail (http, "Sandbox not found", status);
    case GRPC_STATUS_ALREADY_EXISTS: return shim_detail (http, "Sandbox already exists", status);
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
    case GRPC_STATUS_FAILED_PRECONDITION: return shim_detail (http, d, status);
    case GRPC_STATUS_DEADLINE_EXCEEDED: return shim_detail (http, "Gateway timed out", status);
    case GRPC_STATUS_UNAVAILABLE:
      if (http == 503)
        return shim_detail (http, d, status);
      snprintf (buf, sizeof buf, "Gateway unreachable: %.900s", d);
      return shim_detail (http, buf, status);
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED:
      return shim_detail (http, "Gateway rejected the shim's credentials (check SHIM_GATEWAY_SECRET)", status);
    default:
      snprintf (buf, sizeof buf, "Gateway error (%s): %.900s", rpc_status_name (code), d);
      return shim_detail (http, buf, status);
    }
}

struct MHD_Response *
shim_gateway_error_named (grpc_status_code code, const rpc_status_t *st, unsigned *status)
{
  bool named = code == GRPC_STATUS_NOT_FOUND || code == GRPC_STATUS_ALREADY_EXISTS;
  if (!named || st == NULL || st->details == NULL || st->details[0] == '\0')
    return shim_gateway_error (code, st, status);
  metrics_gateway_error (code);
  note_missing (code, st);
  return shim_detail (shim_http_status (code, st->from_handler), st->details, status);
}

int
shim_req_fd (shim_req_t *r)
{
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info (r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci != NULL ? ci->connect_fd : -1;
}
