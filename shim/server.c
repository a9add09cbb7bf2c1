/* server: the HTTP side of the shim on libmicrohttpd.
 *
 * Owns the request lifecycle: route matching, the bearer check, body
 * handling (JSON bodies buffered under a cap, restore bodies streamed to the
 * route as they arrive), the answer, the access log line and the metrics.
 * Routes (routes/) only see a parsed request; answers are built by
 * response.c, slow clients cut by watchdog.c.
 *
 * MHD runs one thread per connection, so a route may block on the gateway.
 * Threads are bounded by bounding connections: SHIM_MAX_CONNECTIONS in
 * all, SHIM_MAX_CONNECTIONS_PER_CLIENT from one peer address (MHD refuses
 * the rest at accept), and near the cap the watchdog closes connections
 * that wait for a head (idle keep-alive ones first) while answers carry
 * `Connection: close` — so clients that only hold connections, however
 * cheap their requests, cannot keep others out. (A pool of MHD threads with
 * suspended connections would bound threads below connections, but every
 * route that waits on the gateway — exec, files, the proxy's streams —
 * would have to become resumable: the bound here is a cap instead.)
 * The access handler is called several times per request:
 * the access handler is called several times per request: first with the
 * headers, then with each piece of body, then once more to answer. A route
 * may answer 101 and take the socket over (MHD_ALLOW_UPGRADE: the terminal
 * route); MHD then reports the request completed and keeps counting the
 * connection against SHIM_MAX_CONNECTIONS until the route gives the socket
 * back.
 */
#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/bearer.h"
#include "common/log.h"
#include "shim/metrics.h"
#include "shim/router.h"
#include "shim/routes/routes.h"
#include "shim/shim.h"
#include "shim/watchdog.h"
#include "shim/ws.h"

shim_t shim;

int64_t
shim_mono_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- routing --------------------------------------------------------------------- */

/* The cap of a streamed body, by what it is: a restore's tar
 * (SHIM_MAX_RESTORE_BYTES), a file's bytes (SHIM_MAX_FILE_UPLOAD_BYTES) or
 * a request into a sandbox's port (SHIM_MAX_PROXY_BODY_BYTES). */
static uint64_t
stream_cap (const shim_route_t *rt)
{
  if (rt->upload == route_file_put_upload)
    return (uint64_t) shim.cfg.max_file_upload_bytes;
  if (rt->upload == proxy_upload)
    return (uint64_t) shim.cfg.max_proxy_body_bytes;
  return (uint64_t) shim.cfg.max_restore_bytes;
}

/* 413, and a log line naming the setting that capped it. */
static void
body_too_large (shim_req_t *r)
{
  const shim_route_t *rt = r->route;
  const char *setting = rt->body != SHIM_BODY_STREAM          ? "SHIM_MAX_JSON_BODY"
                        : rt->upload == route_file_put_upload ? "SHIM_MAX_FILE_UPLOAD_BYTES"
                        : rt->upload == proxy_upload          ? "SHIM_MAX_PROXY_BODY_BYTES"
                                                              : "SHIM_MAX_RESTORE_BYTES";
  log_msg (SEV_INFO, "%s %s: body over %s: 413", rt->method, rt->path, setting);
  shim_req_fail (r, 413, "Request body too large");
}

static void
start_request (shim_req_t *r, const char *url, const char *method)
{
  bool path_known = false, too_long = false;
  r->route = shim_route_find (shim_routes, shim_n_routes, url, method, r->id, r->pid, &path_known, &too_long);
  if (r->route == NULL)
    {
      if (path_known)
        shim_req_fail (r, 405, "Method Not Allowed");
      else
        shim_req_fail (r, 404, "Not Found");
      return;
    }
  if (r->route->auth)
    {
      if (shim.cfg.secret == NULL || shim.cfg.secret[0] == '\0')
        {
          shim_req_fail (r, 503, "Gateway secret not configured");
          return;
        }
      const char *auth = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
      const char *offer = r->route->bearer_in_subprotocol
                              ? MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, "Sec-WebSocket-Protocol")
                              : NULL;
      if (!bearer_matches (auth, shim.cfg.secret) && !ws_offer_has_bearer (offer, shim.cfg.secret))
        {
          shim_req_fail (r, 401, "Invalid or missing bearer token");
          return;
        }
    }
  if (strstr (r->route->path, "{id}") != NULL)
    {
      shim_errors_t e;
      shim_errors_init (&e);
      if (too_long)
        shim_errors_add (&e, "string_too_long", "path", "sandbox_id", "String should have at most 64 characters");
      else
        {
          shim_check_id (r->id, "path", "sandbox_id", &e);
          if (r->pid[0] != '\0' && strstr (r->route->path, "{pid}") != NULL)
            shim_check_id (r->pid, "path", "process_id", &e);
        }
      if (shim_errors_any (&e))
        {
          shim_req_fail_json (r, 422, shim_errors_take (&e));
          return;
        }
      shim_errors_release (&e);
    }
  if (r->route->admit != NULL)
    {
      r->route->admit (r);
      if (r->early != NULL)
        return;
    }
  if (r->route->body != SHIM_BODY_NONE)
    {
      const char *cl = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      unsigned long long declared = cl != NULL ? strtoull (cl, NULL, 10) : 0;
      unsigned long long cap = r->route->body == SHIM_BODY_STREAM ? stream_cap (r->route) : SHIM_MAX_JSON_BODY;
      if (declared > cap)
        body_too_large (r);
    }
}

static void
take_body (shim_req_t *r, const char *data, size_t size)
{
  r->body_bytes += size;
  if (r->discard)
    return;
  if (r->route->body == SHIM_BODY_STREAM)
    {
      if (r->body_bytes > stream_cap (r->route))
        body_too_large (r);
      else
        {
          metrics_bytes (true, size);
          r->route->upload (r, data, size);
        }
      return;
    }
  if (r->route->body != SHIM_BODY_JSON && r->route->body != SHIM_BODY_RAW)
    return;
  if (r->len + size > SHIM_MAX_JSON_BODY)
    {
      body_too_large (r);
      return;
    }
  if (r->len + size + 1 > r->cap)
    {
      size_t cap = r->cap ? r->cap : 1024;
      while (cap < r->len + size + 1)
        cap *= 2;
      char *b = realloc (r->body, cap);
      if (b == NULL)
        {
          shim_req_fail (r, 503, "Out of memory");
          return;
        }
      r->body = b;
      r->cap = cap;
    }
  memcpy (r->body + r->len, data, size);
  r->len += size;
  r->body[r->len] = '\0';
}

/* Runs the route's handler. With SHIM_RESTORE_ON_MISS, a route about a
 * sandbox that its owner said it does not hold is run once more after the
 * owner restored the sandbox from the store (Connect, restore only): for
 * routes whose body is buffered and that keep no state between requests
 * (every one but uploads, the terminal and the port proxy), and not for
 * DELETE. */
static struct MHD_Response *
handle (shim_req_t *r, unsigned *status)
{
  shim_missed_reset ();
  struct MHD_Response *resp = r->route->handle (r, status);
  const shim_route_t *rt = r->route;
  if (!shim.cfg.restore_on_miss || *status != 404 || r->id[0] == '\0' || rt->body == SHIM_BODY_STREAM
      || rt->cleanup != NULL || strcmp (rt->method, "DELETE") == 0 || !shim_missed (r->id)
      || !route_restore_missing (r->id))
    return resp;
  MHD_destroy_response (resp);
  shim_missed_reset ();
  return rt->handle (r, status);
}

static enum MHD_Result
access_handler (void *cls, struct MHD_Connection *conn, const char *url, const char *method, const char *version,
                const char *upload_data, size_t *upload_data_size, void **con_cls)
{
  shim_req_t *r = *con_cls;
  if (r == NULL || r->conn == NULL)
    {
      if (r == NULL)
        r = calloc (1, sizeof *r);
      if (r == NULL)
        return MHD_NO;
      r->conn = conn;
      r->method = method;
      r->version = version;
      r->start_ns = shim_mono_ns ();
      *con_cls = r;
      start_request (r, url, method);
      watchdog_stage (conn, STAGE_BODY, r->route != NULL && r->route->body == SHIM_BODY_STREAM);
      /* Refusals that need no body go out now, before any upload. */
      if (r->early != NULL && r->early_status != 0)
        {
          r->status = r->early_status;
          enum MHD_Result q = MHD_queue_response (conn, r->early_status, r->early);
          MHD_destroy_response (r->early);
          r->early = NULL;
          return q;
        }
      return MHD_YES;
    }
  if (*upload_data_size > 0)
    {
      watchdog_body (conn, *upload_data_size);
      take_body (r, upload_data, *upload_data_size);
      *upload_data_size = 0;
      return MHD_YES;
    }
  watchdog_stage (conn, STAGE_ANSWER, false);
  struct MHD_Response *resp;
  unsigned status = 500;
  if (r->early != NULL)
    {
      resp = r->early;
      status = r->early_status;
      r->early = NULL;
    }
  else
    resp = handle (r, &status);
  r->status = status;
  /* Near the connection cap, a connection does not stay open after its
   * answer (not an upgrade's: that socket leaves HTTP). */
  if (status != 101 && watchdog_pressed ())
    MHD_add_response_header (resp, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result q = MHD_queue_response (conn, status, resp);
  MHD_destroy_response (resp);
  return q;
}

static void
completed (void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
  watchdog_stage (conn, STAGE_HEAD, false); /* the next request on this connection */
  shim_req_t *r = *con_cls;
  if (r == NULL)
    return;
  if (r->conn == NULL)
    {
      /* Its head never completed: nothing to log. */
      free (r->uri);
      free (r);
      *con_cls = NULL;
      return;
    }
  double secs = (double) (shim_mono_ns () - r->start_ns) / 1e9;
  const char *route = r->route != NULL ? r->route->path : "(unmatched)";
  unsigned status = r->status != 0 ? r->status : 499; /* the client left before an answer */
  metrics_request (r->method, route, status, r->status_foreign, secs);
  json_t *f = json_pack ("{s:s, s:s, s:i, s:f, s:b}", "method", r->method, "route", route, "status", (int) status,
                         "duration_s", secs, "completed", toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
  if (r->id[0] != '\0')
    json_object_set_new (f, "sandbox_id", json_string (r->id));
  log_fields (SEV_INFO, f, "request");
  if (r->route != NULL && r->route->cleanup != NULL)
    r->route->cleanup (r);
  if (r->early != NULL)
    MHD_destroy_response (r->early);
  free (r->body);
  free (r->uri);
  free (r);
  *con_cls = NULL;
}

/* MHD_OPTION_URI_LOG_CALLBACK: the request's state begins with its target
 * as sent (the port proxy passes path and query on undecoded). */
static void *
uri_seen (void *cls, const char *uri, struct MHD_Connection *conn)
{
  (void) cls;
  (void) conn;
  shim_req_t *r = calloc (1, sizeof *r);
  if (r != NULL)
    r->uri = strdup (uri);
  return r;
}

static void
mhd_log (void *cls, const char *fmt, va_list ap)
{
  char *msg = NULL;
  if (vasprintf (&msg, fmt, ap) < 0)
    return;
  size_t n = strlen (msg);
  while (n > 0 && msg[n - 1] == '\n')
    msg[--n] = '\0';
  log_fields (SEV_WARNING, json_pack ("{s:s}", "component", "http"), "%s", msg);
  free (msg);
}

/* MHD's memory pool per connection (request head, headers, buffers): a
 * head that does not fit is refused by MHD with an HTTP error, logged through
 * mhd_log. */
#define SHIM_CONNECTION_MEMORY (256 * 1024)
/* The stack of each connection's thread. */
#define SHIM_THREAD_STACK (512 * 1024)

struct MHD_Daemon *
shim_server_start (const struct sockaddr *addr, err_t *err)
{
  struct MHD_Daemon *d = MHD_start_daemon (
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_USE_ITC
          | MHD_USE_TURBO | MHD_ALLOW_UPGRADE,
      0, NULL, NULL, access_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR, addr,
      MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_URI_LOG_CALLBACK, uri_seen, NULL,
      MHD_OPTION_NOTIFY_CONNECTION, watchdog_notify_connection, NULL, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned) shim.cfg.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned) shim.cfg.max_connections_per_client, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned) shim.cfg.connection_timeout, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) SHIM_CONNECTION_MEMORY,
      MHD_OPTION_THREAD_STACK_SIZE, (size_t) SHIM_THREAD_STACK, MHD_OPTION_END);
  if (d == NULL)
    {
      err_make (err, EADDRINUSE, "cannot listen on %s:%ld (address in use or not valid)", shim.cfg.host,
                shim.cfg.port);
      return NULL;
    }
  if (watchdog_start (err) < 0)
    {
      MHD_stop_daemon (d);
      return NULL;
    }
  return d;
}
