/* routes/exec: POST /sandboxes/{id}/exec — buffered JSON (the contract) or,
 * with Accept: application/x-ndjson, one JSON event per line as output
 * arrives; either way each stream is cut at SHIM_MAX_EXEC_OUTPUT. While the call runs, the hang-up watcher cancels it
 * if the client leaves. State: per request, but for the bytes all buffered answers hold (SHIM_MAX_BUFFERED_OUTPUT),
 * an atomic counter every request thread updates. */
#include <errno.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/routes/routes.h"

/* ---- POST /sandboxes/{id}/exec -------------------------------------------------- */

/* The buffered answer holds each stream's output only as base64 text, made
 * as the output arrives (the one or two bytes short of a group of three
 * wait in `rest`), and is served from those buffers: no other copy of the
 * output is made. The text all buffered answers hold counts against
 * SHIM_MAX_BUFFERED_OUTPUT, reserved before it is made and given back when
 * the answer has been sent (or dropped). */

/* Bytes of base64 text held by all buffered answers. */
static _Atomic uint64_t buffered_bytes;

/* Reserves `n` bytes of SHIM_MAX_BUFFERED_OUTPUT; false when they do not fit. */
static bool
budget_take (uint64_t n)
{
  uint64_t max = (uint64_t) shim.cfg.max_buffered_output;
  uint64_t cur = atomic_load (&buffered_bytes);
  do
    {
      if (cur > max || n > max - cur)
        return false;
    }
  while (!atomic_compare_exchange_weak (&buffered_bytes, &cur, cur + n));
  return true;
}

static void
budget_give (uint64_t n)
{
  atomic_fetch_sub (&buffered_bytes, n);
}

/* The base64 size of `n` bytes. */
static size_t
b64_size (size_t n)
{
  return 4 * ((n + 2) / 3);
}

typedef struct exec_b64_s
{
  char *text;      /* base64 of the bytes kept, but for `rest` */
  size_t len, cap; /* cap leaves room for `rest`'s group and a NUL */
  uint8_t rest[3]; /* the last bytes kept, fewer than 3, not yet encoded */
  size_t n_rest;
  size_t kept;     /* bytes kept: at most SHIM_MAX_EXEC_OUTPUT */
  size_t reserved; /* budget held: b64_size (kept) */
  bool truncated;
} exec_b64_t;

/* Grows o->text to hold at least `need` bytes (geometrically, at most the
 * answer's largest size). */
static int
exec_b64_grow (exec_b64_t *o, size_t need, err_t *err)
{
  if (need <= o->cap)
    return 0;
  size_t most = b64_size ((size_t) shim.cfg.max_exec_output) + 1;
  size_t cap = o->cap ? o->cap : 4096;
  while (cap < need)
    cap *= 2;
  if (cap > most)
    cap = most;
  char *t = realloc (o->text, cap);
  if (t == NULL)
    return err_make (err, ENOMEM, "Out of memory");
  o->text = t;
  o->cap = cap;
  return 0;
}

/* Adds output to the stream's text: cut at SHIM_MAX_EXEC_OUTPUT (then
 * `truncated`); -1 when the budget or memory is exhausted. */
static int
exec_b64_add (exec_b64_t *o, const uint8_t *data, size_t len, err_t *err)
{
  size_t max = (size_t) shim.cfg.max_exec_output;
  if (len > max - o->kept)
    {
      len = max - o->kept;
      o->truncated = true;
    }
  if (len == 0)
    return 0;
  size_t need = b64_size (o->kept + len);
  if (!budget_take (need - o->reserved))
    return err_make (err, ENOBUFS,
                     "Exec output exceeds what the shim buffers for all exec answers at once "
                     "(SHIM_MAX_BUFFERED_OUTPUT, %ld bytes of base64); retry later, or stream it with "
                     "Accept: application/x-ndjson",
                     shim.cfg.max_buffered_output);
  o->reserved = need;
  if (exec_b64_grow (o, need + 1, err) < 0)
    return -1;
  o->kept += len;
  if (o->n_rest > 0)
    {
      while (o->n_rest < 3 && len > 0)
        {
          o->rest[o->n_rest++] = *data++;
          len--;
        }
      if (o->n_rest < 3)
        return 0;
      o->len += (size_t) EVP_EncodeBlock ((unsigned char *) o->text + o->len, o->rest, 3);
      o->n_rest = 0;
    }
  size_t whole = len - len % 3;
  if (whole > 0)
    o->len += (size_t) EVP_EncodeBlock ((unsigned char *) o->text + o->len, data, (int) whole);
  memcpy (o->rest, data + whole, len - whole);
  o->n_rest = len - whole;
  return 0;
}

/* Encodes the last bytes (with padding): o->text is then the whole base64
 * of what was kept. Room for it was made when they came. */
static void
exec_b64_finish (exec_b64_t *o)
{
  if (o->n_rest > 0)
    o->len += (size_t) EVP_EncodeBlock ((unsigned char *) o->text + o->len, o->rest, (int) o->n_rest);
  o->n_rest = 0;
}

static void
exec_b64_release (exec_b64_t *o)
{
  free (o->text);
  budget_give (o->reserved);
  *o = (exec_b64_t){0};
}

/* Starts the Exec call for the validated body. */
static rpc_client_call_t *
exec_start (shim_req_t *r, const shim_exec_body_t *b, rpc_status_t *st)
{
  cleanup_free Sandbox__V1__ExecRequest__EnvEntry *entries = calloc (b->n_env + 1, sizeof *entries);
  cleanup_free Sandbox__V1__ExecRequest__EnvEntry **ptrs = calloc (b->n_env + 1, sizeof *ptrs);
  if (entries == NULL || ptrs == NULL)
    {
      /* Answered 503 as the shim's own failures are. */
      st->code = GRPC_STATUS_UNAVAILABLE;
      st->from_handler = true;
      st->details = strdup ("Out of memory");
      return NULL;
    }
  Sandbox__V1__ExecRequest req = SANDBOX__V1__EXEC_REQUEST__INIT;
  req.sandbox_id = r->id;
  req.argv = b->argv;
  req.n_argv = b->argc;
  req.timeout_seconds = (uint32_t) b->timeout;
  for (size_t i = 0; i < b->n_env; i++)
    {
      sandbox__v1__exec_request__env_entry__init (&entries[i]);
      entries[i].key = b->env_keys[i];
      entries[i].value = b->env_values[i];
      ptrs[i] = &entries[i];
    }
  req.env = ptrs;
  req.n_env = b->n_env;
  if (b->cwd != NULL)
    req.cwd = b->cwd;
  req.stdin.data = b->stdin_data;
  req.stdin.len = b->stdin_len;
  return route_call_open (r->id, "/sandbox.v1.Sandbox/Exec", b->timeout * 1000 + ROUTE_EXEC_MARGIN_MS, &req.base,
                          NULL, 0, true, st);
}

static json_t *
exit_json (const Sandbox__V1__ExitStatus *x)
{
  json_t *j = json_pack ("{s:o, s:b}", "exit_code", route_exit_code_json (x), "timed_out", x->timed_out);
  /* Additive, and only when true: the contract's answer is otherwise
   * unchanged. */
  if (j != NULL && x->oom_killed)
    json_object_set_new (j, "oom_killed", json_true ());
  if (j != NULL && x->pids_limited)
    json_object_set_new (j, "pids_limited", json_true ());
  return j;
}

/* An NDJSON exec's state: how much of each stream has been forwarded.
 * Each stream is cut at SHIM_MAX_EXEC_OUTPUT as the buffered answer's is;
 * what comes after is read (the command is not held up) but not sent, and
 * the exit line then says "truncated": true. */
typedef struct exec_stream_s
{
  size_t sent[2]; /* stdout, stderr */
  bool truncated;
} exec_stream_t;

/* One exec event as an NDJSON line (route_ndjson; `ctx` an exec_stream_t). */
static json_t *
exec_event_json (const ProtobufCMessage *m, void *ctx)
{
  exec_stream_t *s = ctx;
  const Sandbox__V1__ExecEvent *e = (const Sandbox__V1__ExecEvent *) m;
  if (e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT
      || e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDERR)
    {
      bool out = e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT;
      ProtobufCBinaryData d = out ? e->stdout : e->stderr;
      size_t max = (size_t) shim.cfg.max_exec_output, *sent = &s->sent[out ? 0 : 1];
      if (d.len > max - *sent)
        {
          d.len = max - *sent;
          s->truncated = true;
        }
      if (d.len == 0)
        return NULL;
      *sent += d.len;
      return route_output_json (out, d);
    }
  if (e->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_EXIT && e->exit != NULL)
    {
      metrics_exec_duration ((double) e->exit->duration_ms / 1000.0);
      json_t *j = exit_json (e->exit);
      if (j != NULL && s->truncated)
        json_object_set_new (j, "truncated", json_true ());
      return j;
    }
  return NULL;
}

static bool
wants_ndjson (shim_req_t *r)
{
  const char *accept = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
  return accept != NULL && strcasestr (accept, "application/x-ndjson") != NULL;
}

/* The contract's answer, {"exit_code","timed_out","stdout_b64","stderr_b64"}
 * and "truncated": true when output was cut, in that order and laid out as
 * json_dumps (JSON_COMPACT) lays it out (base64 needs no escaping); served
 * piece by piece from the streams' text. Owned by its MHD response. */
typedef struct exec_answer_s
{
  char *head; /* {"exit_code":..,"timed_out":..,"stdout_b64":" */
  exec_b64_t out, err;
  const char *tail;
} exec_answer_t;

#define ANSWER_MID "\",\"stderr_b64\":\""
#define ANSWER_TAIL "\"}"
#define ANSWER_TAIL_TRUNCATED "\",\"truncated\":true}"

/* MHD's reader (an event thread): copies the answer made in memory, never
 * blocks, so it needs no worker (stream.h). */
static ssize_t
answer_read (void *cls, uint64_t pos, char *buf, size_t max)
{
  exec_answer_t *a = cls;
  const struct
  {
    const char *p;
    size_t n;
  } part[] = {
      {a->head, strlen (a->head)}, {a->out.text, a->out.len},   {ANSWER_MID, strlen (ANSWER_MID)},
      {a->err.text, a->err.len},   {a->tail, strlen (a->tail)},
  };
  size_t done = 0;
  for (size_t i = 0; i < sizeof part / sizeof part[0] && done < max; i++)
    {
      if (pos >= part[i].n)
        {
          pos -= part[i].n;
          continue;
        }
      size_t k = part[i].n - (size_t) pos < max - done ? part[i].n - (size_t) pos : max - done;
      memcpy (buf + done, part[i].p + pos, k);
      done += k;
      pos = 0;
    }
  return done > 0 ? (ssize_t) done : MHD_CONTENT_READER_END_OF_STREAM;
}

static void
answer_free (void *cls)
{
  exec_answer_t *a = cls;
  free (a->head);
  exec_b64_release (&a->out);
  exec_b64_release (&a->err);
  free (a);
}

/* Answers 200 with `a` (taken) and the exit status `exit_st` (taken). */
static struct MHD_Response *
exec_answer (exec_answer_t *a, json_t *exit_st, unsigned *status)
{
  metrics_bytes (false, a->out.kept + a->err.kept);
  exec_b64_finish (&a->out);
  exec_b64_finish (&a->err);
  a->tail = a->out.truncated || a->err.truncated ? ANSWER_TAIL_TRUNCATED : ANSWER_TAIL;
  cleanup_free char *text = json_dumps (exit_st, JSON_COMPACT);
  json_decref (exit_st);
  /* The exit status's object without its closing brace. */
  if (text == NULL || asprintf (&a->head, "%.*s,\"stdout_b64\":\"", (int) strlen (text) - 1, text) < 0)
    {
      a->head = NULL;
      answer_free (a);
      return shim_detail (503, "Out of memory", status);
    }
  uint64_t size = strlen (a->head) + a->out.len + strlen (ANSWER_MID) + a->err.len + strlen (a->tail);
  struct MHD_Response *resp = MHD_create_response_from_callback (size, 64 * 1024, answer_read, a, answer_free);
  if (resp == NULL)
    {
      answer_free (a);
      return shim_detail (503, "Out of memory", status);
    }
  MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  *status = 200;
  return resp;
}

/* Reads the exec's events into `a` until the call's stream ends; its exit
 * status goes to *exit_st. -1 with *err when the output cannot be held (the
 * call is then still running). */
static int
exec_collect (rpc_client_call_t *c, exec_answer_t *a, json_t **exit_st, err_t *err)
{
  for (;;)
    {
      cleanup_message ProtobufCMessage *m = NULL;
      err_t rerr = ERR_INIT;
      int rc = rpc_client_recv (c, &sandbox__v1__exec_event__descriptor, &m, &rerr);
      err_release (&rerr);
      if (rc <= 0)
        return 0;
      Sandbox__V1__ExecEvent *ev = (Sandbox__V1__ExecEvent *) m;
      if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDOUT)
        rc = exec_b64_add (&a->out, ev->stdout.data, ev->stdout.len, err);
      else if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_STDERR)
        rc = exec_b64_add (&a->err, ev->stderr.data, ev->stderr.len, err);
      else if (ev->event_case == SANDBOX__V1__EXEC_EVENT__EVENT_EXIT && ev->exit != NULL && *exit_st == NULL)
        {
          *exit_st = exit_json (ev->exit);
          metrics_exec_duration ((double) ev->exit->duration_ms / 1000.0);
        }
      if (rc < 0)
        return -1;
    }
}

/* Collects the whole exec, then answers with one JSON object. Takes `c`. */
static struct MHD_Response *
exec_buffered (shim_req_t *r, rpc_client_call_t *c, unsigned *status)
{
  exec_answer_t *a = calloc (1, sizeof *a);
  if (a == NULL)
    {
      rpc_client_destroy (c);
      return shim_detail (503, "Out of memory", status);
    }
  hangup_t *w = hangup_add (shim_req_fd (r), c);
  json_t *exit_st = NULL;
  err_t err = ERR_INIT;
  int held = exec_collect (c, a, &exit_st, &err);
  bool hung_up = hangup_remove (w);
  rpc_status_t st = RPC_STATUS_INIT;
  grpc_status_code code = GRPC_STATUS_CANCELLED;
  if (held == 0)
    code = rpc_client_finish (c, &st);
  rpc_client_destroy (c); /* cancels the exec when its output was refused */
  struct MHD_Response *resp;
  if (held < 0)
    resp = shim_detail (503, err_msg (&err), status);
  else if (code == GRPC_STATUS_OK && exit_st != NULL)
    resp = exec_answer (take_ptr (&a), take_ptr (&exit_st), status);
  else if (code == GRPC_STATUS_OK)
    resp = shim_detail (502, "Gateway ended the exec without an exit status", status);
  else if (hung_up)
    resp = shim_detail (499, "Client closed the request", status);
  else
    resp = shim_gateway_error (code, &st, status);
  if (a != NULL)
    answer_free (a);
  json_decref (exit_st);
  rpc_status_release (&st);
  err_release (&err);
  return resp;
}

struct MHD_Response *
route_exec (shim_req_t *r, unsigned *status)
{
  shim_errors_t e;
  shim_errors_init (&e);
  shim_exec_body_t body;
  const char *ct = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!shim_parse_exec (ct, r->body, r->len, &body, &e))
    return shim_json (shim_errors_take (&e), 422, status);
  shim_errors_release (&e);

  rpc_status_t st = RPC_STATUS_INIT;
  rpc_client_call_t *c = exec_start (r, &body, &st);
  shim_exec_body_release (&body);
  if (c == NULL)
    {
      struct MHD_Response *out = shim_gateway_error (st.code, &st, status);
      rpc_status_release (&st);
      return out;
    }
  if (!wants_ndjson (r))
    return exec_buffered (r, c, status);
  exec_stream_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    {
      rpc_client_destroy (c);
      return shim_detail (503, "Out of memory", status);
    }
  return route_ndjson (r, c, &sandbox__v1__exec_event__descriptor, exec_event_json, s, shim_gateway_error, status);
}
