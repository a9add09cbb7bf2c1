/* server: the HTTP side of the shim on libmicrohttpd.
 *
 * Owns the request lifecycle: route matching, the bearer check, body
 * handling (JSON bodies buffered under a cap, restore bodies streamed to the
 * route as they arrive), the answer, the access log line and the metrics.
 * Routes (routes/) only see a parsed request; answers are built by
 * response.c, slow clients cut by watchdog.c.
 *
 * Threads: MHD runs SHIM_EVENT_THREADS event loops (epoll) over every
 * connection; they never block. What may block — a route's handler (its
 * gateway calls), a streamed body's next piece (route->upload), a streamed
 * answer's next piece (stream.h) — runs on a worker (workers.h), at most
 * SHIM_MAX_WORKERS at once, while its connection is suspended; the worker
 * resumes it when done, and the event loop goes on with the result. So a
 * connection holds a thread only while a worker does something for it: an
 * idle keep-alive connection, a head that is slow to come, an answer its
 * client does not read cost none. Connections are still capped
 * (SHIM_MAX_CONNECTIONS in all, SHIM_MAX_CONNECTIONS_PER_CLIENT per peer
 * address, refused at accept) for their descriptors and memory, and near
 * the cap the watchdog closes connections that wait for a head (idle
 * keep-alive ones first) while answers carry `Connection: close`. Refusals
 * decided before the handler (auth, validation, caps) are answered on the
 * event thread, without a worker.
 *
 * The access handler is called several times per request: first with the
 * headers, then with each piece of body, then once more to answer (and,
 * after a worker resumed the connection, once more with its answer). A
 * route may answer 101 and take the socket over (MHD_ALLOW_UPGRADE: the
 * terminal route, the proxy's WebSockets; their threads are their own,
 * capped by SHIM_MAX_TERMINALS and SHIM_MAX_FORWARDS); MHD then reports the
 * request completed and keeps counting the connection against
 * SHIM_MAX_CONNECTIONS until the route gives the socket back.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
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
#include "shim/stream.h"
#include "shim/watchdog.h"
#include "shim/workers.h"
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

/* A streamed body's piece, to the route (on a worker). */
static void
take_streamed (shim_req_t *r, const char *data, size_t size)
{
  if (r->discard)
    return;
  if (r->body_bytes > stream_cap (r->route))
    body_too_large (r);
  else
    {
      metrics_bytes (true, size);
      r->route->upload (r, data, size);
    }
}

/* A buffered body's piece (on the event thread: memory only). */
static void
take_buffered (shim_req_t *r, const char *data, size_t size)
{
  if (r->discard || (r->route->body != SHIM_BODY_JSON && r->route->body != SHIM_BODY_RAW))
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
      || rt->cleanup != NULL || strcmp (rt->method, "DELETE") == 0 || !shim_missed ()
      || !route_restore_missing (r->id))
    return resp;
  MHD_destroy_response (resp);
  shim_missed_reset ();
  return rt->handle (r, status);
}

/* ---- work on workers ------------------------------------------------------------------ */

/* Connections suspended whose resume is not yet asked for. MHD_stop_daemon
 * takes the resumes asked for (MHD_ALLOW_SUSPEND_RESUME) and aborts on a
 * connection still suspended. */
static atomic_long n_suspended;

void
shim_suspend (struct MHD_Connection *conn, shim_work_t *w)
{
  atomic_store (&w->working, true);
  atomic_fetch_add (&n_suspended, 1);
  MHD_suspend_connection (conn);
}

void
shim_work_done (struct MHD_Connection *conn, shim_work_t *w)
{
  atomic_store (&w->working, false);
  MHD_resume_connection (conn);
  atomic_fetch_sub (&n_suspended, 1);
}

bool
shim_called_back (shim_work_t *w)
{
  /* MHD may call once more in the pass that suspended (its chunked-body
   * loop does): not yet back, the worker still has the state. */
  return !atomic_load (&w->working);
}

bool
shim_none_suspended (int64_t wait_ms)
{
  for (int64_t waited = 0; atomic_load (&n_suspended) > 0; waited += 10)
    {
      if (waited >= wait_ms)
        return false;
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep (&ts, NULL);
    }
  return true;
}

static const char busy_detail[] = "The shim is busy: no worker was free in time; retry";

/* The handler's run (a worker): its answer, for the event thread to queue. */
static void
answer_job (void *arg)
{
  shim_req_t *r = arg;
  unsigned status = 500;
  struct MHD_Response *resp = handle (r, &status);
  shim_stream_prefetch (r);
  r->answer = resp;
  r->answer_status = status;
  r->answered = true;
  shim_work_done (r->conn, &r->work);
}

static void
answer_expired (void *arg)
{
  shim_req_t *r = arg;
  log_msg (SEV_WARNING, "%s %s: no worker free within %d ms (SHIM_MAX_WORKERS): 503", r->route->method,
           r->route->path, WORKERS_QUEUE_MS);
  r->answer = shim_detail (503, busy_detail, &r->answer_status);
  r->answered = true;
  shim_work_done (r->conn, &r->work);
}

/* A streamed body's piece (a worker). */
static void
piece_job (void *arg)
{
  shim_req_t *r = arg;
  take_streamed (r, r->piece, r->piece_len);
  free (r->piece);
  r->piece = NULL;
  shim_work_done (r->conn, &r->work);
}

static void
piece_expired (void *arg)
{
  shim_req_t *r = arg;
  free (r->piece);
  r->piece = NULL;
  shim_req_fail (r, 503, busy_detail);
  shim_work_done (r->conn, &r->work);
}

/* Suspends the connection and hands `run` to a worker; false when no
 * worker will take it (the connection is then resumed). */
static bool
to_worker (shim_req_t *r, void (*run) (void *), void (*expire) (void *))
{
  r->job = (worker_job_t){.run = run, .expire = expire, .arg = r};
  shim_suspend (r->conn, &r->work);
  if (workers_submit (&r->job) == 0)
    return true;
  shim_work_done (r->conn, &r->work);
  shim_called_back (&r->work);
  return false;
}

/* ---- the access handler ----------------------------------------------------------------- */

static enum MHD_Result
first_call (struct MHD_Connection *conn, const char *url, const char *method, const char *version, void **con_cls)
{
  shim_req_t *r = *con_cls;
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

/* A piece of body: buffered here, or handed to the route on a worker. */
static enum MHD_Result
body_piece (shim_req_t *r, const char *data, size_t size)
{
  watchdog_body (r->conn, size);
  r->body_bytes += size;
  if (r->route->body != SHIM_BODY_STREAM || r->discard)
    {
      take_buffered (r, data, size);
      return MHD_YES;
    }
  r->piece = malloc (size);
  if (r->piece == NULL)
    {
      shim_req_fail (r, 503, "Out of memory");
      return MHD_YES;
    }
  memcpy (r->piece, data, size);
  r->piece_len = size;
  if (!to_worker (r, piece_job, piece_expired))
    {
      free (r->piece);
      r->piece = NULL;
      shim_req_fail (r, 503, busy_detail);
    }
  return MHD_YES;
}

static enum MHD_Result
access_handler (void *cls, struct MHD_Connection *conn, const char *url, const char *method, const char *version,
                const char *upload_data, size_t *upload_data_size, void **con_cls)
{
  (void) cls;
  shim_req_t *r = *con_cls;
  if (r != NULL && !shim_called_back (&r->work))
    return MHD_YES; /* its worker has it: the data waits (not consumed) */
  if (r == NULL || r->conn == NULL)
    return first_call (conn, url, method, version, con_cls);
  if (*upload_data_size > 0)
    {
      size_t n = *upload_data_size;
      *upload_data_size = 0;
      return body_piece (r, upload_data, n);
    }
  watchdog_stage (conn, STAGE_ANSWER, false);
  struct MHD_Response *resp;
  unsigned status = 500;
  if (r->answered)
    {
      resp = r->answer;
      status = r->answer_status;
      r->answer = NULL;
    }
  else if (r->early != NULL)
    {
      resp = r->early;
      status = r->early_status;
      r->early = NULL;
    }
  else
    {
      if (to_worker (r, answer_job, answer_expired))
        return MHD_YES;
      resp = shim_detail (503, busy_detail, &status);
    }
  r->status = status;
  /* Near the connection cap, a connection does not stay open after its
   * answer (not an upgrade's: that socket leaves HTTP). */
  if (status != 101 && watchdog_pressed ())
    MHD_add_response_header (resp, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result q = MHD_queue_response (conn, status, resp);
  shim_stream_detach (r);
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
  shim_called_back (&r->work);
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
  if (r->answer != NULL)
    MHD_destroy_response (r->answer);
  shim_stream_detach (r);
  free (r->piece);
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
/* The stack of each event thread. */
#define SHIM_THREAD_STACK (512 * 1024)
/* MHD's event loops: each serves a share of the connections, never blocks. */
#define SHIM_EVENT_THREADS 2

struct MHD_Daemon *
shim_server_start (const struct sockaddr *addr, err_t *err)
{
  workers_init ((size_t) shim.cfg.max_workers);
  struct MHD_Daemon *d = MHD_start_daemon (
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_TURBO
          | MHD_ALLOW_UPGRADE,
      0, NULL, NULL, access_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR, addr,
      MHD_OPTION_THREAD_POOL_SIZE, (unsigned) SHIM_EVENT_THREADS, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
      MHD_OPTION_URI_LOG_CALLBACK, uri_seen, NULL, MHD_OPTION_NOTIFY_CONNECTION, watchdog_notify_connection, NULL,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned) shim.cfg.max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
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
