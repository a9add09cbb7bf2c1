/* routes/processes: a sandbox's detached processes — start one, list them,
 * describe one, read its output (NDJSON: the buffered part, then live
 * output until it exits when following), write its stdin, signal it,
 * resize its terminal.
 *
 * Each request is one gateway call: Run for starting (always detached) and
 * for everything that goes through an attachment (output, stdin, resize),
 * ListProcesses and SignalProcess for the rest. A process outlives every
 * call made here: the starting call is cancelled once the process runs,
 * and a client that leaves an output stream only ends its attachment.
 * The terminal's WebSocket is not here. State: per request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/routes/routes.h"

#define RUN_METHOD "/sandbox.v1.Sandbox/Run"

/* ---- JSON of the gateway's messages ------------------------------------------ */

/* A JSON string of gateway text, which need not be valid UTF-8 (an argv
 * given over gRPC): such text is replaced rather than failing the answer. */
static json_t *
text_json (const char *text)
{
  json_t *j = json_string (text != NULL ? text : "");
  return j != NULL ? j : json_string ("(not valid UTF-8)");
}

static json_t *
exit_status_json (const Sandbox__V1__ExitStatus *x)
{
  return json_pack ("{s:o, s:o, s:b, s:b, s:b, s:o}", "exit_code", route_exit_code_json (x), "signal",
                    route_exit_signal_json (x), "timed_out", x->timed_out, "oom_killed", x->oom_killed,
                    "pids_limited", x->pids_limited, "message", text_json (x->message));
}

static json_t *
process_info_json (const Sandbox__V1__ProcessInfo *p)
{
  json_t *argv = json_array ();
  for (size_t i = 0; i < p->n_argv; i++)
    json_array_append_new (argv, text_json (p->argv[i]));
  json_t *pty = p->pty != NULL ? json_pack ("{s:i, s:i}", "rows", (int) p->pty->rows, "cols", (int) p->pty->cols)
                               : json_null ();
  json_t *exit = p->exit != NULL ? exit_status_json (p->exit) : json_null ();
  return json_pack ("{s:o, s:i, s:o, s:o, s:b, s:b, s:I, s:I, s:o}", "process_id", text_json (p->process_id), "pid",
                    (int) p->pid, "argv", argv, "pty", pty, "detached", p->detached, "running", p->running,
                    "started_at_ms", (json_int_t) p->started_at_ms, "output_dropped_bytes",
                    (json_int_t) p->output_dropped_bytes, "exit", exit);
}

/* One event of an attachment as an NDJSON line (route_ndjson): output in
 * base64, the exit status last; `started` is not shown. */
static json_t *
process_event_json (const ProtobufCMessage *m, void *ctx)
{
  (void) ctx;
  const Sandbox__V1__ProcessEvent *e = (const Sandbox__V1__ProcessEvent *) m;
  if (e->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STDOUT
      || e->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STDERR)
    {
      bool out = e->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STDOUT;
      return route_output_json (out, out ? e->stdout : e->stderr);
    }
  if (e->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_EXIT && e->exit != NULL)
    return exit_status_json (e->exit);
  return NULL;
}

/* The answer for a failed call (*st released). */
static struct MHD_Response *
call_error (rpc_status_t *st, bool hung_up, unsigned *status)
{
  struct MHD_Response *out = hung_up ? shim_detail (499, "Client closed the request", status)
                                     : shim_gateway_error_named (st->code, st, status);
  rpc_status_release (st);
  return out;
}

/* ---- Run calls ----------------------------------------------------------------- */

/* Starts a Run call: `first` (`start` or `attach`), then `rest`. */
static rpc_client_call_t *
run_open (const char *id, const Sandbox__V1__ProcessInput *first, Sandbox__V1__ProcessInput *const *rest, size_t n,
          bool half_close, int64_t timeout_ms, rpc_status_t *st)
{
  return route_call_open (id, RUN_METHOD, timeout_ms, &first->base, (const ProtobufCMessage *const *) rest, n,
                          half_close, st);
}

/* An `attach` to the request's process as a first message. */
static void
attach_init (shim_req_t *r, Sandbox__V1__ProcessInput *in, Sandbox__V1__ProcessAttach *a, bool replay, bool no_follow)
{
  sandbox__v1__process_attach__init (a);
  a->sandbox_id = r->id;
  a->process_id = r->pid;
  a->replay = replay;
  a->no_follow = no_follow;
  sandbox__v1__process_input__init (in);
  in->input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_ATTACH;
  in->attach = a;
}

/* Attaches without following, sends `input` (n messages), half-closes and
 * reads the call to its end: it ends OK once the gateway has applied every
 * message. The output that comes meanwhile is not wanted here. Answers
 * 204, or the call's error. */
static struct MHD_Response *
run_inputs (shim_req_t *r, Sandbox__V1__ProcessInput *const *input, size_t n, unsigned *status)
{
  Sandbox__V1__ProcessInput first;
  Sandbox__V1__ProcessAttach a;
  attach_init (r, &first, &a, false, true);
  rpc_status_t st = RPC_STATUS_INIT;
  rpc_client_call_t *c = run_open (r->id, &first, input, n, true, ROUTE_SHORT_CALL_MS, &st);
  if (c == NULL)
    return call_error (&st, false, status);
  hangup_t *w = hangup_add (shim_req_fd (r), c);
  for (;;)
    {
      cleanup_message ProtobufCMessage *m = NULL;
      err_t err = ERR_INIT;
      int rc = rpc_client_recv (c, &sandbox__v1__process_event__descriptor, &m, &err);
      err_release (&err);
      if (rc <= 0)
        break;
    }
  bool hung_up = hangup_remove (w);
  grpc_status_code code = rpc_client_finish (c, &st);
  rpc_client_destroy (c);
  if (code == GRPC_STATUS_OK)
    {
      rpc_status_release (&st);
      return shim_empty (204, status);
    }
  return call_error (&st, hung_up, status);
}

/* ---- POST /sandboxes/{id}/processes -------------------------------------------- */

/* The `start` message of the validated body (pointing into it and into the
 * caller's storage; `entries` and `ptrs` hold b->n_env each). */
static void
start_init (shim_req_t *r, shim_process_body_t *b, Sandbox__V1__ProcessStart *s, Sandbox__V1__PtySize *pty,
            Sandbox__V1__ProcessStart__EnvEntry *entries, Sandbox__V1__ProcessStart__EnvEntry **ptrs)
{
  sandbox__v1__process_start__init (s);
  s->sandbox_id = r->id;
  s->argv = b->argv;
  s->n_argv = b->argc;
  for (size_t i = 0; i < b->n_env; i++)
    {
      sandbox__v1__process_start__env_entry__init (&entries[i]);
      entries[i].key = b->env_keys[i];
      entries[i].value = b->env_values[i];
      ptrs[i] = &entries[i];
    }
  s->env = ptrs;
  s->n_env = b->n_env;
  if (b->cwd != NULL)
    s->cwd = b->cwd;
  s->timeout_seconds = (uint32_t) b->timeout;
  if (b->rows > 0)
    {
      sandbox__v1__pty_size__init (pty);
      pty->rows = b->rows;
      pty->cols = b->cols;
      s->pty = pty;
    }
  s->detach = true;
  s->process_id = b->process_id;
}

/* Waits for the `started` event of a starting call: the process's info as
 * JSON, or NULL when the call ended first. */
static json_t *
wait_started (rpc_client_call_t *c)
{
  for (;;)
    {
      cleanup_message ProtobufCMessage *m = NULL;
      err_t err = ERR_INIT;
      int rc = rpc_client_recv (c, &sandbox__v1__process_event__descriptor, &m, &err);
      err_release (&err);
      if (rc <= 0)
        return NULL;
      const Sandbox__V1__ProcessEvent *e = (const Sandbox__V1__ProcessEvent *) m;
      if (e->event_case == SANDBOX__V1__PROCESS_EVENT__EVENT_STARTED && e->started != NULL)
        return process_info_json (e->started);
    }
}

struct MHD_Response *
route_process_start (shim_req_t *r, unsigned *status)
{
  shim_errors_t e;
  shim_errors_init (&e);
  shim_process_body_t b;
  const char *ct = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!shim_parse_process (ct, r->body, r->len, &b, &e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);
  cleanup_free Sandbox__V1__ProcessStart__EnvEntry *entries = calloc (b.n_env + 1, sizeof *entries);
  cleanup_free Sandbox__V1__ProcessStart__EnvEntry **ptrs = calloc (b.n_env + 1, sizeof *ptrs);
  if (entries == NULL || ptrs == NULL)
    {
      shim_process_body_release (&b);
      return shim_detail (503, "Out of memory", status);
    }
  Sandbox__V1__ProcessStart start;
  Sandbox__V1__PtySize pty;
  start_init (r, &b, &start, &pty, entries, ptrs);
  Sandbox__V1__ProcessInput in = SANDBOX__V1__PROCESS_INPUT__INIT;
  in.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_START;
  in.start = &start;
  rpc_status_t st = RPC_STATUS_INIT;
  rpc_client_call_t *c = run_open (r->id, &in, NULL, 0, false, ROUTE_SHORT_CALL_MS, &st);
  shim_process_body_release (&b);
  if (c == NULL)
    return call_error (&st, false, status);
  hangup_t *w = hangup_add (shim_req_fd (r), c);
  json_t *info = wait_started (c);
  bool hung_up = hangup_remove (w);
  struct MHD_Response *out;
  if (info != NULL)
    out = shim_json (info, 201, status);
  else
    {
      if (rpc_client_finish (c, &st) != GRPC_STATUS_OK)
        out = call_error (&st, hung_up, status);
      else
        {
          rpc_status_release (&st);
          out = shim_detail (502, "Gateway ended the start without the process", status);
        }
    }
  /* The process is detached: cancelling its starting call leaves it running. */
  rpc_client_destroy (c);
  return out;
}

/* ---- GET /sandboxes/{id}/processes, GET .../processes/{pid} --------------------- */

/* The sandbox's processes, or NULL with the answer in *out. */
static Sandbox__V1__ListProcessesResponse *
list_processes (shim_req_t *r, struct MHD_Response **out, unsigned *status)
{
  Sandbox__V1__ListProcessesRequest req = SANDBOX__V1__LIST_PROCESSES_REQUEST__INIT;
  req.sandbox_id = r->id;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  if (route_unary (r->id, "/sandbox.v1.Sandbox/ListProcesses", &req.base,
                   &sandbox__v1__list_processes_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS)
      == 0)
    {
      rpc_status_release (&st);
      return (Sandbox__V1__ListProcessesResponse *) resp;
    }
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  *out = call_error (&st, false, status);
  return NULL;
}

struct MHD_Response *
route_process_list (shim_req_t *r, unsigned *status)
{
  struct MHD_Response *out = NULL;
  Sandbox__V1__ListProcessesResponse *l = list_processes (r, &out, status);
  if (l == NULL)
    return out;
  json_t *arr = json_array ();
  for (size_t i = 0; i < l->n_processes; i++)
    json_array_append_new (arr, process_info_json (l->processes[i]));
  protobuf_c_message_free_unpacked (&l->base, NULL);
  return shim_json (json_pack ("{s:o}", "processes", arr), 200, status);
}

struct MHD_Response *
route_process_get (shim_req_t *r, unsigned *status)
{
  struct MHD_Response *out = NULL;
  Sandbox__V1__ListProcessesResponse *l = list_processes (r, &out, status);
  if (l == NULL)
    return out;
  json_t *info = NULL;
  for (size_t i = 0; i < l->n_processes && info == NULL; i++)
    if (strcmp (l->processes[i]->process_id, r->pid) == 0)
      info = process_info_json (l->processes[i]);
  protobuf_c_message_free_unpacked (&l->base, NULL);
  if (info != NULL)
    return shim_json (info, 200, status);
  char detail[200];
  snprintf (detail, sizeof detail, "no process `%s` in sandbox `%s`", r->pid, r->id);
  return shim_detail (404, detail, status);
}

/* ---- GET /sandboxes/{id}/processes/{pid}/output ---------------------------------- */

struct MHD_Response *
route_process_output (shim_req_t *r, unsigned *status)
{
  bool replay = true, follow = false;
  json_t *bad = route_query_bool (r, "replay", &replay);
  if (bad == NULL)
    bad = route_query_bool (r, "follow", &follow);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  Sandbox__V1__ProcessInput in;
  Sandbox__V1__ProcessAttach a;
  attach_init (r, &in, &a, replay, !follow);
  rpc_status_t st = RPC_STATUS_INIT;
  /* No input follows; without `follow` the half-close is what lets the
   * call end once the buffered output is sent. No deadline: a followed
   * process may run for hours. */
  rpc_client_call_t *c = run_open (r->id, &in, NULL, 0, true, 0, &st);
  if (c == NULL)
    return call_error (&st, false, status);
  return route_ndjson (r, c, &sandbox__v1__process_event__descriptor, process_event_json, NULL,
                       shim_gateway_error_named, status);
}

/* ---- POST .../stdin, .../signal, .../resize ---------------------------------------- */

struct MHD_Response *
route_process_stdin (shim_req_t *r, unsigned *status)
{
  bool close = false;
  json_t *bad = route_query_bool (r, "close", &close);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  Sandbox__V1__ProcessInput data = SANDBOX__V1__PROCESS_INPUT__INIT;
  data.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_STDIN;
  data.stdin.data = (uint8_t *) r->body;
  data.stdin.len = r->len;
  Sandbox__V1__ProcessInput eof = SANDBOX__V1__PROCESS_INPUT__INIT;
  eof.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_CLOSE_STDIN;
  eof.close_stdin = true;
  Sandbox__V1__ProcessInput *input[2];
  size_t n = 0;
  if (r->len > 0)
    input[n++] = &data;
  if (close)
    input[n++] = &eof;
  metrics_bytes (true, r->len);
  return run_inputs (r, input, n, status);
}

struct MHD_Response *
route_process_signal (shim_req_t *r, unsigned *status)
{
  shim_errors_t e;
  shim_errors_init (&e);
  int sig = 0;
  const char *ct = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!shim_parse_signal (ct, r->body, r->len, &sig, &e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);
  Sandbox__V1__SignalProcessRequest req = SANDBOX__V1__SIGNAL_PROCESS_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.process_id = r->pid;
  req.signal = sig;
  ProtobufCMessage *resp = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  int rc = route_unary (r->id, "/sandbox.v1.Sandbox/SignalProcess", &req.base,
                        &sandbox__v1__signal_process_response__descriptor, &resp, &st, ROUTE_SHORT_CALL_MS);
  if (resp != NULL)
    protobuf_c_message_free_unpacked (resp, NULL);
  if (rc == 0)
    {
      rpc_status_release (&st);
      return shim_empty (204, status);
    }
  return call_error (&st, false, status);
}

struct MHD_Response *
route_process_resize (shim_req_t *r, unsigned *status)
{
  shim_errors_t e;
  shim_errors_init (&e);
  unsigned rows = 0, cols = 0;
  const char *ct = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!shim_parse_resize (ct, r->body, r->len, &rows, &cols, &e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);
  Sandbox__V1__PtySize size = SANDBOX__V1__PTY_SIZE__INIT;
  size.rows = rows;
  size.cols = cols;
  Sandbox__V1__ProcessInput in = SANDBOX__V1__PROCESS_INPUT__INIT;
  in.input_case = SANDBOX__V1__PROCESS_INPUT__INPUT_RESIZE;
  in.resize = &size;
  Sandbox__V1__ProcessInput *input[] = {&in};
  return run_inputs (r, input, 1, status);
}
