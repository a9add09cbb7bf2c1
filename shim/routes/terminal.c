/* routes/terminal: GET /sandboxes/{id}/processes/{pid}/terminal — a
 * WebSocket attached to a detached process: binary frames carry its stdin
 * (in) and its output (out), text frames JSON control (resize, signal,
 * close_stdin in; exit out). Behind it, one gateway Run call that attaches
 * to the process.
 *
 * Before the upgrade, on the request's worker: the handshake checks
 * (400), a terminal slot (429), the attach call and its `started` event
 * (404 and other gateway errors as plain HTTP), then 101. After it, two
 * threads of the terminal's own:
 *
 *   - the socket thread (term_main) owns the WebSocket (ws.c) and is the
 *     call's sender: client messages become ProcessInput messages as they
 *     arrive; it also writes the output the pump hands it;
 *   - the pump (terminal_pump) is the call's receiver: ProcessEvents go into a
 *     bounded queue (TERMINAL_MAX_BUFFERED) and the socket thread is woken
 *     through an eventfd. A full queue holds the pump back, which holds the
 *     gateway back (flow control), so a slow client costs bounded memory.
 *
 * rpc.h allows one sending and one receiving thread on a call once the
 * first message went each way, which the attach and `started` exchange
 * does before the threads start.
 *
 * Endings: the client closes or vanishes → the call is cancelled (the
 * process runs on); the client leaves too many answers (pongs, error
 * replies) unread → close 1008 (ws.c), the same; the process exits → the exit JSON, close 1000; the
 * call fails → close 1011; the shim stops → close 1001. Then the socket
 * goes back to MHD (MHD_UPGRADE_ACTION_CLOSE), which frees the connection
 * slot the terminal held all along.
 *
 * The JSON messages are terminal_messages.c's; the state both threads
 * share is terminal_term.h's.
 *
 * The registry of terminals (reg_mu) caps them (SHIM_MAX_TERMINALS) and
 * lets terminal_stop_all() end them before the HTTP daemon stops.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/bearer.h"
#include "common/log.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/members.h"
#include "shim/routes/routes.h"
#include "shim/routes/terminal_messages.h"
#include "shim/routes/terminal_term.h"
#include "shim/watchdog.h"
#include "shim/ws.h"

#define TERMINAL_PROTOCOL "terminal"
/* Largest client message (a paste); larger closes the socket with 1009. */
#define TERMINAL_MAX_INPUT (1024 * 1024)
/* Messages handed to wslay and not yet written to the socket. */
#define TERMINAL_MAX_WS_QUEUED 8
/* A ping after this long without one (idle paths stay open; a dead peer's
 * socket fails). */
#define TERMINAL_PING_MS 30000
/* After our close frame, how long the client has to answer it. */
#define TERMINAL_CLOSE_WAIT_MS 2000
/* How long terminal_stop_all waits for the terminals to end. */
#define TERMINAL_STOP_WAIT_MS 10000
#define TERMINAL_THREAD_STACK (256 * 1024)

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reg_cv = PTHREAD_COND_INITIALIZER;
static term_t *terms;
static long n_terms;
static atomic_bool stopping;

static int64_t
now_ms (void)
{
  return shim_mono_ns () / 1000000;
}

/* ---- the registry ------------------------------------------------------------ */

/* A new terminal holding a slot, or NULL with the HTTP status in *code. */
static term_t *
term_new (shim_req_t *r, unsigned *code)
{
  term_t *t = calloc (1, sizeof *t);
  if (t == NULL || (t->wake_fd = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
    {
      free (t);
      *code = 503;
      return NULL;
    }
  snprintf (t->sandbox_id, sizeof t->sandbox_id, "%s", r->id);
  snprintf (t->process_id, sizeof t->process_id, "%s", r->pid);
  t->start_ns = shim_mono_ns ();
  pthread_mutex_init (&t->mu, NULL);
  pthread_cond_init (&t->cv, NULL);
  pthread_mutex_lock (&reg_mu);
  if (atomic_load (&stopping) || n_terms >= shim.cfg.max_terminals)
    {
      *code = atomic_load (&stopping) ? 503 : 429;
      pthread_mutex_unlock (&reg_mu);
      close (t->wake_fd);
      free (t);
      return NULL;
    }
  t->next = terms;
  if (terms != NULL)
    terms->prev = t;
  terms = t;
  n_terms++;
  pthread_mutex_unlock (&reg_mu);
  return t;
}

/* Ends the call, gives the socket back to MHD, leaves the registry, frees.
 * The pump must have been joined. */
static void
term_release (term_t *t)
{
  pthread_mutex_lock (&reg_mu);
  t->call_visible = false;
  pthread_mutex_unlock (&reg_mu);
  rpc_client_destroy (t->call); /* cancels a running call: the process runs on */
  ws_free (t->ws);
  if (t->urh != NULL)
    MHD_upgrade_action (t->urh, MHD_UPGRADE_ACTION_CLOSE);
  pthread_mutex_lock (&reg_mu);
  if (t->prev != NULL)
    t->prev->next = t->next;
  else
    terms = t->next;
  if (t->next != NULL)
    t->next->prev = t->prev;
  n_terms--;
  pthread_cond_broadcast (&reg_cv);
  pthread_mutex_unlock (&reg_mu);
  while (t->head != NULL)
    {
      chunk_t *c = t->head;
      t->head = c->next;
      free (c);
    }
  close (t->wake_fd);
  pthread_mutex_destroy (&t->mu);
  pthread_cond_destroy (&t->cv);
  free (t);
}

void
terminal_stop_all (void)
{
  pthread_mutex_lock (&reg_mu);
  atomic_store (&stopping, true);
  for (term_t *t = terms; t != NULL; t = t->next)
    {
      terminal_wake (t);
      /* A socket thread waiting on a send (the process does not read)
       * would not see the wake-up: the cancel frees it. */
      if (t->call_visible)
        rpc_client_cancel (t->call);
    }
  struct timespec until;
  clock_gettime (CLOCK_REALTIME, &until);
  until.tv_sec += TERMINAL_STOP_WAIT_MS / 1000;
  while (n_terms > 0)
    if (pthread_cond_timedwait (&reg_cv, &reg_mu, &until) == ETIMEDOUT)
      break;
  long left = n_terms;
  pthread_mutex_unlock (&reg_mu);
  if (left > 0)
    log_msg (SEV_WARNING, "%ld terminal(s) still open at shutdown", left);
}

/* ---- client → gateway ---------------------------------------------------------- */

/* A message from the client (ws_message_fn), on the socket thread. */
static void
term_input (void *user, bool text, const uint8_t *data, size_t len)
{
  term_t *t = user;
  if (t->input_failed)
    return;
  Sandbox__V1__ProcessInput in = SANDBOX__V1__PROCESS_INPUT__INIT;
  Sandbox__V1__PtySize size = SANDBOX__V1__PTY_SIZE__INIT;
  json_t *doc = NULL;
  if (!text)
    {
      if (len == 0)
        return;
      in.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_STDIN;
      in.stdin.data = (uint8_t *) data;
      in.stdin.len = len;
      metrics_bytes (true, len);
    }
  else
    {
      const char *why = terminal_control_of (data, len, &in, &size, &doc);
      if (why != NULL)
        {
          char *s = terminal_error_text (why);
          if (s != NULL)
            ws_send (t->ws, true, s, strlen (s));
          free (s);
          json_decref (doc);
          return;
        }
    }
  err_t err = ERR_INIT;
  if (rpc_client_send (t->call, &in.base, &err) < 0)
    t->input_failed = true; /* the call has ended: the pump sees why */
  err_release (&err);
  json_decref (doc);
}

/* ---- the socket thread ----------------------------------------------------------- */

/* Hands queued output to the WebSocket, a few messages ahead of the
 * socket. */
static void
term_flush (term_t *t)
{
  pthread_mutex_lock (&t->mu);
  bool freed = false;
  while (t->head != NULL && ws_queued (t->ws) < TERMINAL_MAX_WS_QUEUED)
    {
      chunk_t *c = t->head;
      t->head = c->next;
      if (t->head == NULL)
        t->tail = NULL;
      t->buffered -= c->len;
      ws_send (t->ws, c->text, c->data, c->len);
      free (c);
      freed = true;
    }
  if (freed)
    pthread_cond_broadcast (&t->cv);
  pthread_mutex_unlock (&t->mu);
}

/* The gateway's stream has ended and its output is out: close 1000 after
 * an exit, 1011 with the reason otherwise. Returns the reason logged. */
static const char *
term_close_ended (term_t *t)
{
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = rpc_client_finish (t->call, &st);
  const char *why = "process exited";
  if (t->exited || code == GRPC_STATUS_OK)
    ws_close (t->ws, WS_CLOSE_NORMAL, "");
  else
    {
      metrics_gateway_error (code);
      char reason[124];
      snprintf (reason, sizeof reason, "gateway: %s: %s", rpc_status_name (code), st.details ? st.details : "");
      ws_close (t->ws, WS_CLOSE_INTERNAL, reason);
      why = "gateway call ended";
    }
  rpc_status_release (&st);
  return why;
}

/* One step after a poll: output, then a close when it is time. Returns the
 * reason of a close it queued, or NULL. */
static const char *
term_step (term_t *t, int64_t *last_ping)
{
  term_flush (t);
  if (ws_flooded (t->ws))
    return "client left its answers unread"; /* ws.c queued a close 1008 */
  if (ws_closing (t->ws))
    return NULL;
  if (atomic_load (&stopping))
    {
      ws_close (t->ws, WS_CLOSE_GOING_AWAY, "server shutting down");
      return "shim stopping";
    }
  pthread_mutex_lock (&t->mu);
  bool done = t->ended && t->head == NULL;
  pthread_mutex_unlock (&t->mu);
  if (done && ws_queued (t->ws) == 0)
    return term_close_ended (t);
  if (now_ms () - *last_ping >= TERMINAL_PING_MS)
    {
      ws_ping (t->ws);
      *last_ping = now_ms ();
    }
  return NULL;
}

static void *
term_main (void *arg)
{
  term_t *t = arg;
  pthread_attr_t attr;
  pthread_attr_init (&attr);
  pthread_attr_setstacksize (&attr, TERMINAL_THREAD_STACK);
  t->pump_started = pthread_create (&t->pump, &attr, terminal_pump, t) == 0;
  pthread_attr_destroy (&attr);
  const char *why = "client closed";
  int64_t last_ping = now_ms (), close_deadline = -1;
  if (!t->pump_started)
    {
      ws_close (t->ws, WS_CLOSE_INTERNAL, "cannot start the terminal");
      why = "no thread";
      close_deadline = now_ms () + TERMINAL_CLOSE_WAIT_MS;
    }
  for (;;)
    {
      bool woken = false;
      if (ws_poll (t->ws, t->wake_fd, 1000, &woken) == 0)
        break;
      if (close_deadline < 0)
        {
          const char *closed = term_step (t, &last_ping);
          if (closed != NULL)
            {
              why = closed;
              close_deadline = now_ms () + TERMINAL_CLOSE_WAIT_MS;
            }
        }
      else if (now_ms () >= close_deadline)
        break;
    }
  /* Detach from the process (it runs on), stop the pump, let go. */
  rpc_client_cancel (t->call);
  pthread_mutex_lock (&t->mu);
  t->closing = true;
  pthread_cond_broadcast (&t->cv);
  pthread_mutex_unlock (&t->mu);
  if (t->pump_started)
    pthread_join (t->pump, NULL);
  double secs = (double) (shim_mono_ns () - t->start_ns) / 1e9;
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:s, s:s, s:f}", "sandbox_id", t->sandbox_id, "process_id", t->process_id, "reason",
                         why, "duration_s", secs),
              "terminal closed");
  term_release (t);
  return NULL;
}

/* MHD_UpgradeHandler: runs on an MHD event thread once the 101 is out (it
 * must not block: the terminal's own threads take over). */
static void
term_upgraded (void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra_in, size_t extra_in_size,
               MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
  term_t *t = cls;
  shim_req_t *r = con_cls;
  r->state = NULL; /* the request's cleanup no longer frees the terminal */
  watchdog_stage (conn, STAGE_UPGRADED, false);
  t->urh = urh;
  pthread_mutex_lock (&reg_mu);
  t->call_visible = true;
  pthread_mutex_unlock (&reg_mu);
  t->ws = ws_new (sock, extra_in, extra_in_size, TERMINAL_MAX_INPUT, term_input, t);
  pthread_attr_t attr;
  pthread_attr_init (&attr);
  pthread_attr_setstacksize (&attr, TERMINAL_THREAD_STACK);
  pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
  pthread_t th;
  bool ok = t->ws != NULL && pthread_create (&th, &attr, term_main, t) == 0;
  pthread_attr_destroy (&attr);
  if (!ok)
    {
      log_msg (SEV_WARNING, "terminal for process `%s`: cannot start (out of memory or threads)", t->process_id);
      term_release (t);
    }
}

/* ---- the route --------------------------------------------------------------------- */

/* NULL when the request is a WebSocket opening handshake we speak (the
 * accept key in `accept`), else why not. */
static const char *
handshake_problem (shim_req_t *r, char accept[WS_ACCEPT_LEN + 1])
{
  struct MHD_Connection *c = r->conn;
  return ws_handshake_problem (r->version, MHD_lookup_connection_value (c, MHD_HEADER_KIND, MHD_HTTP_HEADER_UPGRADE),
                               MHD_lookup_connection_value (c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONNECTION),
                               MHD_lookup_connection_value (c, MHD_HEADER_KIND, "Sec-WebSocket-Version"),
                               MHD_lookup_connection_value (c, MHD_HEADER_KIND, "Sec-WebSocket-Key"), accept);
}

/* Starts the attach call and waits for `started`: 0, or -1 with the HTTP
 * answer in *resp. While it waits, a client that hangs up cancels it. */
static int
term_attach (shim_req_t *r, term_t *t, bool replay, struct MHD_Response **resp, unsigned *status)
{
  Sandbox__V1__ProcessAttach attach = SANDBOX__V1__PROCESS_ATTACH__INIT;
  attach.sandbox_id = r->id;
  attach.process_id = r->pid;
  attach.replay = replay;
  Sandbox__V1__ProcessInput first = SANDBOX__V1__PROCESS_INPUT__INIT;
  first.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_ATTACH;
  first.attach = &attach;
  err_t err = ERR_INIT;
  rpc_client_call_t *call = NULL;
  if (rpc_client_start (members_route (r->id), "/sandbox.v1.Sandbox/Run", 0, shim.md, shim.n_md, &call, &err) < 0)
    {
      rpc_status_t st = {.code = GRPC_STATUS_UNAVAILABLE, .details = (char *) err_msg (&err)};
      *resp = shim_gateway_error (st.code, &st, status);
      err_release (&err);
      return -1;
    }
  t->call = call;
  hangup_t *w = hangup_add (shim_req_fd (r), call);
  ProtobufCMessage *m = NULL;
  int rc = rpc_client_send (call, &first.base, &err);
  if (rc == 0)
    rc = rpc_client_recv (call, &sandbox__v1__process_event__descriptor, &m, &err);
  hangup_remove (w);
  err_release (&err);
  bool started = rc > 0 && ((Sandbox__V1__ProcessEvent *) m)->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STARTED;
  if (m != NULL)
    protobuf_c_message_free_unpacked (m, NULL);
  if (started)
    return 0;
  rpc_client_cancel (call);
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = rpc_client_finish (call, &st);
  if (code == GRPC_STATUS_NOT_FOUND)
    {
      metrics_gateway_error (code);
      *resp = shim_detail (shim_http_status (code, st.from_handler), "Sandbox or process not found", status);
    }
  else if (code == GRPC_STATUS_OK)
    *resp = shim_detail (502, "Gateway error: the attach call ended before the process was found", status);
  else
    *resp = shim_gateway_error (code, &st, status);
  rpc_status_release (&st);
  return -1;
}

/* The 101 answer that hands the socket to term_upgraded. */
static struct MHD_Response *
term_switch (shim_req_t *r, term_t *t, const char *accept, unsigned *status)
{
  const char *offer = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, "Sec-WebSocket-Protocol");
  const char *auth = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  /* The bearer protocol is echoed only when it is how the client
   * authenticated and it offered nothing else we speak. */
  char buf[4200];
  const char *proto = ws_pick_protocol (
      offer, TERMINAL_PROTOCOL, bearer_matches (auth, shim.cfg.secret) ? NULL : shim.cfg.secret, buf, sizeof buf);
  struct MHD_Response *resp = MHD_create_response_for_upgrade (term_upgraded, t);
  if (resp == NULL)
    return shim_detail (503, "Out of memory", status);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONNECTION, "Upgrade");
  MHD_add_response_header (resp, MHD_HTTP_HEADER_UPGRADE, "websocket");
  MHD_add_response_header (resp, "Sec-WebSocket-Accept", accept);
  if (proto != NULL)
    MHD_add_response_header (resp, "Sec-WebSocket-Protocol", proto);
  r->state = t;
  *status = MHD_HTTP_SWITCHING_PROTOCOLS;
  return resp;
}

struct MHD_Response *
route_terminal (shim_req_t *r, unsigned *status)
{
  char accept[WS_ACCEPT_LEN + 1];
  const char *problem = handshake_problem (r, accept);
  if (problem != NULL)
    {
      struct MHD_Response *resp = shim_detail (400, problem, status);
      MHD_add_response_header (resp, "Sec-WebSocket-Version", "13");
      return resp;
    }
  bool replay = true;
  json_t *bad = route_query_bool (r, "replay", &replay);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  unsigned code = 0;
  term_t *t = term_new (r, &code);
  if (t == NULL)
    return shim_detail (code, code == 429 ? "Too many terminals open" : "Shutting down", status);
  struct MHD_Response *resp = NULL;
  if (term_attach (r, t, replay, &resp, status) < 0)
    {
      term_release (t);
      return resp;
    }
  resp = term_switch (r, t, accept, status);
  if (r->state == NULL)
    term_release (t);
  return resp;
}

void
route_terminal_cleanup (shim_req_t *r)
{
  /* Still the request's: the 101 never went out (the client left first). */
  term_t *t = r->state;
  r->state = NULL;
  if (t != NULL)
    term_release (t);
}
