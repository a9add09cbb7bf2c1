/* server: the HTTP side of the shim on libmicrohttpd.
 *
 * Owns the request lifecycle: route matching, the bearer check, body
 * handling (JSON bodies buffered under a cap, restore bodies streamed to the
 * route as they arrive), the answer, the access log line and the metrics.
 * Routes (routes.c) only see a parsed request.
 *
 * MHD runs one thread per connection, so a route may block on the gateway;
 * the access handler is called several times per request: first with the
 * headers, then with each piece of body, then once more to answer.
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
#include "shim/shim.h"

shim_t shim;

static int64_t
mono_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- responses ---------------------------------------------------------------- */

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

struct MHD_Response *
shim_gateway_error (grpc_status_code code, const char *details, unsigned *status)
{
  metrics_gateway_error (code);
  const char *d = details != NULL && details[0] != '\0' ? details : rpc_status_name (code);
  char buf[1200];
  switch (code)
    {
    case GRPC_STATUS_NOT_FOUND:
      return shim_detail (404, "Sandbox not found", status);
    case GRPC_STATUS_ALREADY_EXISTS:
      return shim_detail (409, "Sandbox already exists", status);
    case GRPC_STATUS_INVALID_ARGUMENT:
      return shim_detail (422, d, status);
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
      return shim_detail (429, d, status);
    case GRPC_STATUS_DEADLINE_EXCEEDED:
      return shim_detail (504, "Gateway timed out", status);
    case GRPC_STATUS_UNAVAILABLE:
      /* The gateway answering "unavailable" (shutting down, no secret) is
       * not the same as no gateway at all (refused, reset, gone). */
      if (strstr (d, "shutting down") != NULL || strstr (d, "secret not configured") != NULL)
        return shim_detail (503, d, status);
      snprintf (buf, sizeof buf, "Gateway unreachable: %.900s", d);
      return shim_detail (502, buf, status);
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED:
      return shim_detail (502, "Gateway rejected the shim's credentials (check SHIM_GATEWAY_SECRET)", status);
    default:
      snprintf (buf, sizeof buf, "Gateway error (%s): %.900s", rpc_status_name (code), d);
      return shim_detail (502, buf, status);
    }
}

int
shim_req_fd (shim_req_t *r)
{
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info (r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci != NULL ? ci->connect_fd : -1;
}

/* ---- slow clients ----------------------------------------------------------------
 *
 * libmicrohttpd's connection timeout is an idle timeout: a client that sends
 * one byte a second (slowloris) renews it forever and holds a connection
 * slot. A watchdog therefore bounds each stage of a request: the head must
 * arrive within SHIM_HEADER_TIMEOUT (which also closes idle keep-alive
 * connections), a JSON body within SHIM_BODY_TIMEOUT, and a streamed restore
 * body must keep an average of SHIM_MIN_UPLOAD_RATE after its first
 * SHIM_BODY_TIMEOUT. Offenders' sockets are shut down; their threads then
 * end the connection. While a route answers, the client is not timed.
 */

typedef enum stage_e
{
  STAGE_HEAD,
  STAGE_BODY,
  STAGE_ANSWER,
} stage_t;

typedef struct conn_track_s
{
  int fd;
  stage_t stage;
  int64_t since_ns;
  uint64_t body_bytes;
  bool streaming;
  bool cut;
  struct conn_track_s *prev, *next;
} conn_track_t;

static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;
static conn_track_t *tracked;

static conn_track_t *
track_of (struct MHD_Connection *conn)
{
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info (conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci != NULL ? ci->socket_context : NULL;
}

static void
track_stage (struct MHD_Connection *conn, stage_t stage, bool streaming)
{
  conn_track_t *t = track_of (conn);
  if (t == NULL)
    return;
  pthread_mutex_lock (&track_mu);
  t->stage = stage;
  t->since_ns = mono_ns ();
  t->body_bytes = 0;
  t->streaming = streaming;
  pthread_mutex_unlock (&track_mu);
}

static void
track_body (struct MHD_Connection *conn, size_t n)
{
  conn_track_t *t = track_of (conn);
  if (t == NULL)
    return;
  pthread_mutex_lock (&track_mu);
  t->body_bytes += n;
  pthread_mutex_unlock (&track_mu);
}

static void
notify_connection (void *cls, struct MHD_Connection *conn, void **socket_context, enum MHD_ConnectionNotificationCode code)
{
  if (code == MHD_CONNECTION_NOTIFY_STARTED)
    {
      conn_track_t *t = calloc (1, sizeof *t);
      if (t == NULL)
        return;
      const union MHD_ConnectionInfo *ci = MHD_get_connection_info (conn, MHD_CONNECTION_INFO_CONNECTION_FD);
      t->fd = ci != NULL ? ci->connect_fd : -1;
      t->stage = STAGE_HEAD;
      t->since_ns = mono_ns ();
      pthread_mutex_lock (&track_mu);
      t->next = tracked;
      if (tracked != NULL)
        tracked->prev = t;
      tracked = t;
      pthread_mutex_unlock (&track_mu);
      *socket_context = t;
      return;
    }
  conn_track_t *t = *socket_context;
  if (t == NULL)
    return;
  pthread_mutex_lock (&track_mu);
  if (t->prev != NULL)
    t->prev->next = t->next;
  else
    tracked = t->next;
  if (t->next != NULL)
    t->next->prev = t->prev;
  pthread_mutex_unlock (&track_mu);
  free (t);
  *socket_context = NULL;
}

static void *
watchdog_main (void *arg)
{
  (void) arg;
  for (;;)
    {
      struct timespec tick = {0, 500 * 1000 * 1000};
      nanosleep (&tick, NULL);
      int64_t now = mono_ns ();
      int64_t head = shim.cfg.header_timeout * 1000000000LL, body = shim.cfg.body_timeout * 1000000000LL;
      pthread_mutex_lock (&track_mu);
      for (conn_track_t *t = tracked; t != NULL; t = t->next)
        {
          if (t->cut || t->fd < 0)
            continue;
          int64_t age = now - t->since_ns;
          bool slow = false;
          if (t->stage == STAGE_HEAD)
            slow = age > head;
          else if (t->stage == STAGE_BODY && !t->streaming)
            slow = age > body;
          else if (t->stage == STAGE_BODY)
            slow = age > body && (double) t->body_bytes < (double) shim.cfg.min_upload_rate * (double) age / 1e9;
          if (slow)
            {
              t->cut = true;
              shutdown (t->fd, SHUT_RDWR);
            }
        }
      pthread_mutex_unlock (&track_mu);
    }
  return NULL;
}

/* ---- routing --------------------------------------------------------------------- */

static void
start_request (shim_req_t *r, const char *url, const char *method)
{
  bool path_known = false, too_long = false;
  for (size_t i = 0; i < shim_n_routes; i++)
    {
      char id[SHIM_ID_MAX + 2] = "";
      bool tl = false;
      if (!shim_match_path (shim_routes[i].path, url, id, sizeof id, &tl))
        continue;
      path_known = true;
      if (strcmp (shim_routes[i].method, method) != 0)
        continue;
      r->route = &shim_routes[i];
      too_long = tl || strlen (id) > SHIM_ID_MAX;
      size_t n = too_long ? SHIM_ID_MAX : strlen (id); /* a too long id is refused below */
      memcpy (r->id, id, n);
      r->id[n] = '\0';
      break;
    }
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
      if (!bearer_matches (auth, shim.cfg.secret))
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
        shim_check_id (r->id, "path", "sandbox_id", &e);
      if (shim_errors_any (&e))
        {
          shim_req_fail_json (r, 422, shim_errors_take (&e));
          return;
        }
      shim_errors_release (&e);
    }
  if (r->route->body != SHIM_BODY_NONE)
    {
      const char *cl = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      unsigned long long declared = cl != NULL ? strtoull (cl, NULL, 10) : 0;
      unsigned long long cap = r->route->body == SHIM_BODY_JSON ? SHIM_MAX_JSON_BODY
                                                                 : (unsigned long long) shim.cfg.max_restore_bytes;
      if (declared > cap)
        shim_req_fail (r, 413, "Request body too large");
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
      if (r->body_bytes > (uint64_t) shim.cfg.max_restore_bytes)
        shim_req_fail (r, 413, "Request body too large");
      else
        {
          metrics_bytes (true, size);
          r->route->upload (r, data, size);
        }
      return;
    }
  if (r->route->body != SHIM_BODY_JSON)
    return;
  if (r->len + size > SHIM_MAX_JSON_BODY)
    {
      shim_req_fail (r, 413, "Request body too large");
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

static enum MHD_Result
access_handler (void *cls, struct MHD_Connection *conn, const char *url, const char *method, const char *version,
                const char *upload_data, size_t *upload_data_size, void **con_cls)
{
  shim_req_t *r = *con_cls;
  if (r == NULL)
    {
      r = calloc (1, sizeof *r);
      if (r == NULL)
        return MHD_NO;
      r->conn = conn;
      r->method = method;
      r->start_ns = mono_ns ();
      *con_cls = r;
      start_request (r, url, method);
      track_stage (conn, STAGE_BODY, r->route != NULL && r->route->body == SHIM_BODY_STREAM);
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
      track_body (conn, *upload_data_size);
      take_body (r, upload_data, *upload_data_size);
      *upload_data_size = 0;
      return MHD_YES;
    }
  track_stage (conn, STAGE_ANSWER, false);
  struct MHD_Response *resp;
  unsigned status = 500;
  if (r->early != NULL)
    {
      resp = r->early;
      status = r->early_status;
      r->early = NULL;
    }
  else
    resp = r->route->handle (r, &status);
  r->status = status;
  enum MHD_Result q = MHD_queue_response (conn, status, resp);
  MHD_destroy_response (resp);
  return q;
}

static void
completed (void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
  track_stage (conn, STAGE_HEAD, false); /* the next request on this connection */
  shim_req_t *r = *con_cls;
  if (r == NULL)
    return;
  double secs = (double) (mono_ns () - r->start_ns) / 1e9;
  const char *route = r->route != NULL ? r->route->path : "(unmatched)";
  unsigned status = r->status != 0 ? r->status : 499; /* the client left before an answer */
  metrics_request (r->method, route, status, secs);
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
  free (r);
  *con_cls = NULL;
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

struct MHD_Daemon *
shim_server_start (const struct sockaddr *addr, err_t *err)
{
  struct MHD_Daemon *d = MHD_start_daemon (
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG
          | MHD_USE_ITC | MHD_USE_TURBO,
      0, NULL, NULL, access_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR, addr,
      MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, notify_connection, NULL,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned) shim.cfg.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned) shim.cfg.connection_timeout, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) (256 * 1024),
      MHD_OPTION_THREAD_STACK_SIZE, (size_t) (512 * 1024),
      MHD_OPTION_END);
  if (d == NULL)
    {
      err_make (err, EADDRINUSE, "cannot listen on %s:%ld (address in use or not valid)", shim.cfg.host, shim.cfg.port);
      return NULL;
    }
  pthread_t th;
  if (pthread_create (&th, NULL, watchdog_main, NULL) != 0)
    {
      MHD_stop_daemon (d);
      err_make (err, EAGAIN, "start the slow-client watchdog");
      return NULL;
    }
  pthread_detach (th);
  return d;
}
