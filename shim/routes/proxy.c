/* routes/proxy: the HTTP reverse proxy into a sandbox's port —
 * `/sandboxes/{id}/ports/{port}/…` (bearer) and `/p/<token>/…` (a preview
 * link) — over one gateway Forward call per request.
 *
 * The shim speaks HTTP/1.1 to the server in the sandbox itself, over the
 * Forward stream: the request head (the client's method, path and query as
 * sent, its headers minus hop-by-hop ones — the standard set and those its
 * Connection headers list, RFC 9110 §7.6.1 — and our bearer,
 * X-Forwarded-*, `Connection: close`), then the body as it arrives
 * (re-chunked when the client sent it chunked). The answer's head is
 * parsed by shim/http1.c (bounded there; its hop-by-hop headers dropped the
 * same way), its body relayed as it comes — by Content-Length,
 * de-chunked (MHD chunks it again for the client), or to the end of the
 * connection — so long-lived responses (SSE) stream. Data frames are read
 * where gRPC received them (shim/frames.c): the body's bytes are copied
 * once, into MHD's block (PROXY_BLOCK bytes at a time). A 101
 * to a request that asked for an upgrade (WebSocket) hands the client's
 * socket over to two threads of the proxy's own that relay bytes both ways
 * until both sides are closed.
 *
 * Limits: forwarded connections (ports_slot_take: 429; given back once
 * the answer is all read from upstream; preview-link traffic holds only
 * part of each cap), the request head we build (431), the response head
 * (502, at once), interim answers (PROXY_MAX_INTERIM: 502), bytes idle
 * either way, SHIM_FORWARD_IDLE_SECONDS: on the sandbox's side the Forward
 * call's idle timeout (504 before the answer's head, the connection cut
 * after it); on the client's side MHD's connection timeout while the
 * answer goes out, and a send timeout on an upgraded socket — a client
 * that stops reading is cut as a silent server is. A preview link's token
 * is checked before the request's body is read (proxy_admit), and before
 * the gateway is asked anything.
 *
 * Files: this one opens the call and answers the client; the request
 * head is written by proxy_request.c, the call's bytes (and an upgraded
 * connection's relay) are proxy_relay.c's, the answer's head and chunked
 * body are parsed by shim/http1.c (malformed: 502 saying what is wrong).
 *
 * Threading: until an upgrade, everything runs on the request's workers,
 * one at a time (they send and receive on the call); after it, the up thread is the
 * call's only sender and the down thread its only receiver.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/frames.h"
#include "shim/stream.h"
#include "shim/http1.h"
#include "shim/metrics.h"
#include "shim/routes/proxy.h"
#include "shim/routes/proxy_px.h"
#include "shim/routes/routes.h"
#include "shim/watchdog.h"

/* The largest request head sent upstream (the response head's cap is
 * HTTP1_MAX_HEAD). */
#define PROXY_MAX_HEAD (64 * 1024)
/* The most bytes MHD takes from the answer's body at a time (a larger
 * block measured no faster). */
#define PROXY_BLOCK (256 * 1024)
/* The most interim (1xx) answers a server may send before its answer;
 * beyond, 502. */
#define PROXY_MAX_INTERIM 16

/* ---- opening ------------------------------------------------------------------------ */

static struct MHD_Response *
open_failed (px_t *px, grpc_status_code code, const rpc_status_t *st, unsigned *status)
{
  metrics_gateway_error (code);
  if (code == GRPC_STATUS_FAILED_PRECONDITION)
    {
      char msg[96];
      snprintf (msg, sizeof msg, "Nothing listens on port %u in the sandbox", px->port);
      return shim_detail (502, msg, status);
    }
  return shim_gateway_error (code, st, status);
}

/* Gives the request's forwarded-connection slot back, once: as soon as
 * nothing more of its answer comes from upstream, so that it is free
 * before the answer's end reaches the client (who may go on at once). */
static void
px_slot_give_back (px_t *px)
{
  if (px->slot)
    {
      px->slot = false;
      ports_slot_release (px->id, px->preview);
    }
}

/* Opens the Forward call with the request head and waits for the
 * gateway's `connected`: NULL, or the answer. */
static struct MHD_Response *
px_start (shim_req_t *r, px_t *px, unsigned *status)
{
  http1_conn_names_t named = {.n = 0};
  px_request_conn_names (r, &named);
  if (named.over)
    return shim_detail (400, "Too many header names in Connection", status);
  char buf[PROXY_MAX_HEAD];
  px_head_t h = {.buf = buf, .cap = sizeof buf};
  px_request_head (r, px, &named, &h);
  if (h.over)
    return shim_detail (431, "Request head too large to forward", status);
  Sandbox__V1__ForwardFrame first = SANDBOX__V1__FORWARD_FRAME__INIT;
  first.sandbox_id = px->id;
  first.port = px->port;
  first.data.data = (uint8_t *) buf;
  first.data.len = h.len;
  first.idle_timeout_seconds = (uint32_t) shim.cfg.forward_idle_seconds;
  rpc_status_t st = RPC_STATUS_INIT;
  px->call = route_call_open (px->id, "/sandbox.v1.Sandbox/Forward", 0, &first.base, NULL, 0, false, &st);
  if (px->call == NULL)
    {
      struct MHD_Response *resp = open_failed (px, st.code, &st, status);
      rpc_status_release (&st);
      return resp;
    }
  px->hangup = hangup_add (shim_req_fd (r), px->call);
  /* The `connected` frame, or the call's failure. */
  err_t err = ERR_INIT;
  grpc_byte_buffer *bb = NULL;
  bool connected = false;
  int rc = rpc_client_recv_raw (px->call, &bb, &err);
  if (rc > 0 && (frames_take (&px->up, bb, NULL, &connected, &err) < 0 || !connected))
    {
      rpc_client_cancel (px->call); /* not a gateway's answer */
      rc = -1;
    }
  err_release (&err);
  if (rc <= 0)
    {
      grpc_status_code code = rpc_client_finish (px->call, &st);
      struct MHD_Response *resp = open_failed (px, code, &st, status);
      rpc_status_release (&st);
      return resp;
    }
  metrics_bytes (true, h.len);
  return NULL;
}

/* Checks the request's target and takes a slot, then opens the Forward
 * call with the request head (px_start): NULL, or the answer. */
static struct MHD_Response *
px_open (shim_req_t *r, px_t *px, unsigned *status)
{
  if (px->preview)
    {
      const char *uri = r->uri != NULL ? r->uri : "";
      const char *tok = strstr (uri, "/p/");
      if (tok == NULL || ports_token_check (tok + 3, px->id, &px->port) < 0)
        return shim_detail (403, "Invalid or expired link", status);
    }
  else
    {
      char *end;
      unsigned long p = strtoul (r->pid, &end, 10);
      if (*end != '\0' || p < 1 || p > 65535)
        return shim_detail (422, "The port must be a number from 1 to 65535", status);
      snprintf (px->id, sizeof px->id, "%s", r->id);
      px->port = (unsigned) p;
    }
  px->head_method = strcmp (r->method, "HEAD") == 0;
  switch (ports_slot_take (px->id, px->preview))
    {
    case PORTS_SLOT_TAKEN: break;
    case PORTS_SLOT_SANDBOX_FULL:
      return shim_detail (429, "Too many forwarded connections into this sandbox", status);
    case PORTS_SLOT_ALL_FULL: return shim_detail (429, "Too many forwarded connections", status);
    case PORTS_SLOT_NO_MEMORY: return shim_detail (503, "Out of memory", status);
    }
  px->slot = true;
  struct MHD_Response *resp = px_start (r, px, status);
  if (resp != NULL)
    px_slot_give_back (px); /* refused: nothing is forwarded */
  return resp;
}

static px_t *
px_new (shim_req_t *r)
{
  px_t *px = calloc (1, sizeof *px);
  if (px == NULL)
    return NULL;
  px->preview = strncmp (r->route->path, "/p/", 3) == 0;
  px->sock = -1;
  r->state = px;
  return px;
}

int
proxy_upload (shim_req_t *r, const char *data, size_t len)
{
  px_t *px = r->state;
  if (px == NULL)
    {
      px = px_new (r);
      unsigned code = 0;
      struct MHD_Response *resp = px != NULL ? px_open (r, px, &code) : shim_detail (503, "Out of memory", &code);
      if (resp != NULL)
        {
          r->early = resp;
          r->early_status = code;
          r->discard = true;
          return -1;
        }
    }
  int rc = 0;
  if (px->chunked_up)
    {
      char size[24];
      int n = snprintf (size, sizeof size, "%zx\r\n", len);
      rc = px_send_data (px, size, (size_t) n);
      if (rc == 0)
        rc = px_send_data (px, data, len);
      if (rc == 0)
        rc = px_send_data (px, "\r\n", 2);
    }
  else
    rc = px_send_data (px, data, len);
  if (rc < 0)
    {
      px_slot_give_back (px);
      shim_req_fail (r, 502, "The server in the sandbox closed the connection");
      return -1;
    }
  return 0;
}

/* ---- the response ------------------------------------------------------------------ */

typedef enum got_head_e
{
  HEAD_OK,
  HEAD_ENDED,     /* upstream's end (or the call's) before the head's */
  HEAD_TOO_LARGE, /* over HTTP1_MAX_HEAD */
  HEAD_BAD,       /* malformed (px->parsed.error says how) */
  HEAD_NO_MEMORY,
} got_head_t;

/* Reads the response head into px->head and parses it into px->parsed;
 * what follows it becomes the next upstream bytes. */
static got_head_t
read_head (px_t *px)
{
  free (px->head);
  px->head = malloc (HTTP1_MAX_HEAD);
  if (px->head == NULL)
    return HEAD_NO_MEMORY;
  size_t len = 0, scanned = 0, head_len = 0;
  for (;;)
    {
      const uint8_t *p;
      size_t k = px_up_next (px, &p, HTTP1_MAX_HEAD - len);
      if (k == 0)
        return HEAD_ENDED;
      memcpy (px->head + len, p, k);
      len += k;
      int rc = http1_head_scan (px->head, len, &scanned, &head_len);
      if (rc == -EAGAIN)
        continue;
      /* Full without its end: stop here, not read the rest of the stream. */
      if (rc == -E2BIG)
        return HEAD_TOO_LARGE;
      if (rc < 0)
        {
          px->parsed.error = "a line ended by a bare LF";
          return HEAD_BAD;
        }
      /* The rest is body, from the end of the piece just taken (the head
       * ends inside it): put it back. */
      frames_unread (&px->up, len - head_len);
      if (http1_head_parse (px->head, head_len, &px->parsed) < 0)
        return HEAD_BAD;
      return HEAD_OK;
    }
}

/* Adds the parsed head's end-to-end headers to `resp`: not the hop-by-hop
 * ones, nor those its Connection headers list (but Upgrade on a switch to
 * it), nor Content-Length (MHD writes its own). */
static void
take_headers (const http1_head_t *h, struct MHD_Response *resp, bool upgraded)
{
  for (size_t i = 0; i < h->n_header; i++)
    {
      const char *name = h->header[i].name;
      bool upgrade = upgraded && strcasecmp (name, "upgrade") == 0;
      if (!upgrade
          && (http1_hop_by_hop (name) || http1_conn_names_has (&h->conn, name)
              || strcasecmp (name, "content-length") == 0))
        continue;
      MHD_add_response_header (resp, name, h->header[i].value);
    }
}

/* The next bytes of a chunked body into buf, as many as are at hand (at
 * least one): their count, 0 at its end, -1 when malformed or cut short
 * (no last chunk). */
static ssize_t
read_chunked (px_t *px, char *buf, size_t max)
{
  size_t n = 0;
  while (!px->chunked_end && n < max && (n == 0 || px_up_buffered (px)))
    {
      bool in_data = http1_chunked_in_data (&px->chunked);
      size_t want = in_data ? max - n : SIZE_MAX;
      if (in_data && px->chunked.remaining < want)
        want = (size_t) px->chunked.remaining;
      const uint8_t *p;
      size_t k = px_up_next (px, &p, want);
      if (k == 0)
        return -1;
      size_t used = 0, data = 0;
      int rc = http1_chunked_feed (&px->chunked, p, k, &used, &data);
      if (rc < 0)
        {
          log_msg (SEV_WARNING, "port proxy: sandbox `%s` port %u: a chunked body with %s", px->id, px->port,
                   px->chunked.error);
          return -1;
        }
      memcpy (buf + n, p, data);
      n += data;
      if (used < k)
        frames_unread (&px->up, k - used);
      px->chunked_end = rc == 1;
    }
  return (ssize_t) n;
}

static ssize_t
body_read (void *cls, uint64_t pos, char *buf, size_t max)
{
  px_t *px = cls;
  (void) pos;
  ssize_t n = 0;
  switch (px->body)
    {
    case BODY_NONE: break;
    case BODY_CHUNKED: n = read_chunked (px, buf, max); break;
    case BODY_LENGTH:
    case BODY_EOF:
      {
        if (px->body == BODY_LENGTH && px->remaining == 0)
          break;
        size_t want = px->body == BODY_LENGTH && px->remaining < max ? (size_t) px->remaining : max;
        size_t k = px_up_copy (px, (uint8_t *) buf, want);
        if (k == 0)
          n = px->body == BODY_EOF && !px->up_fail ? 0 : -1;
        else
          {
            px->remaining -= px->body == BODY_LENGTH ? k : 0;
            n = (ssize_t) k;
          }
        break;
      }
    }
  if (n <= 0 || (px->body == BODY_LENGTH && px->remaining == 0))
    px_slot_give_back (px); /* the last of the answer is in MHD's hands */
  if (n < 0)
    return MHD_CONTENT_READER_END_WITH_ERROR;
  if (n == 0)
    return MHD_CONTENT_READER_END_OF_STREAM;
  metrics_bytes (false, (uint64_t) n);
  return n;
}

static void
body_done (void *cls)
{
  (void) cls; /* px belongs to the request (proxy_cleanup) */
}

/* ---- the route ---------------------------------------------------------------------- */

/* 503 instead of `resp` (may be NULL). */
static struct MHD_Response *
out_of_memory (struct MHD_Response *resp, unsigned *status)
{
  if (resp != NULL)
    MHD_destroy_response (resp);
  return shim_detail (503, "Out of memory", status);
}

/* The answer when no usable response head came (`got` says why). */
static struct MHD_Response *
head_failed (px_t *px, got_head_t got, unsigned *status)
{
  bool client_gone = hangup_remove (px->hangup);
  px->hangup = NULL;
  if (client_gone)
    return shim_detail (499, "Client closed the request", status);
  if (got == HEAD_NO_MEMORY)
    return shim_detail (503, "Out of memory", status);
  if (got == HEAD_TOO_LARGE)
    {
      char msg[96];
      snprintf (msg, sizeof msg, "The server in the sandbox sent a response head over %d KiB", HTTP1_MAX_HEAD / 1024);
      return shim_detail (502, msg, status);
    }
  if (got == HEAD_BAD && px->parsed.conn.over)
    return shim_detail (502, "The server in the sandbox named too many headers in Connection", status);
  if (got == HEAD_BAD)
    {
      char msg[160];
      snprintf (msg, sizeof msg, "The server in the sandbox sent no valid HTTP response: %s", px->parsed.error);
      log_msg (SEV_WARNING, "port proxy: sandbox `%s` port %u: a response head with %s", px->id, px->port,
               px->parsed.error);
      return shim_detail (502, msg, status);
    }
  if (got == HEAD_ENDED && px->up_fail)
    {
      /* The call is over: its status says whether the gateway cut it idle. */
      rpc_status_t st = RPC_STATUS_INIT;
      grpc_status_code code = rpc_client_finish (px->call, &st);
      rpc_status_release (&st);
      if (code == GRPC_STATUS_DEADLINE_EXCEEDED)
        {
          char msg[96];
          snprintf (msg, sizeof msg, "The server in the sandbox sent nothing for %ld s",
                    shim.cfg.forward_idle_seconds);
          return shim_detail (504, msg, status);
        }
    }
  return shim_detail (502, "The server in the sandbox sent no valid HTTP response", status);
}

/* The answer, once the request is upstream: the server's (px->relaying
 * when a body or an upgrade follows), or one of ours. */
static struct MHD_Response *
px_answer (shim_req_t *r, px_t *px, unsigned *status)
{
  if (px->chunked_up && px_send_data (px, "0\r\n\r\n", 5) < 0)
    return shim_detail (502, "The server in the sandbox closed the connection", status);
  unsigned code = 0;
  for (int interim = 0;; interim++)
    {
      if (interim > PROXY_MAX_INTERIM)
        {
          char msg[96];
          snprintf (msg, sizeof msg, "The server in the sandbox sent over %d interim answers", PROXY_MAX_INTERIM);
          return shim_detail (502, msg, status);
        }
      got_head_t got = read_head (px);
      if (got != HEAD_OK)
        return head_failed (px, got, status);
      code = px->parsed.status;
      if (code < 100 || code >= 200 || code == 101)
        break;
    }
  if (code == 101)
    {
      if (!px->upgrade)
        return shim_detail (502, "The server in the sandbox switched protocols unasked", status);
      struct MHD_Response *resp = MHD_create_response_for_upgrade (px_upgraded, px);
      if (resp == NULL)
        return out_of_memory (resp, status);
      take_headers (&px->parsed, resp, true);
      MHD_add_response_header (resp, MHD_HTTP_HEADER_CONNECTION, "Upgrade");
      px->relaying = true;
      *status = 101;
      r->status_foreign = true;
      return resp;
    }
  const http1_head_t *h = &px->parsed;
  px->body = h->framing == HTTP1_BODY_CHUNKED  ? BODY_CHUNKED
             : h->framing == HTTP1_BODY_LENGTH ? BODY_LENGTH
                                               : BODY_EOF;
  px->remaining = h->content_length;
  if (px->head_method || code == 204 || code == 304)
    px->body = BODY_NONE;
  uint64_t size = px->body == BODY_LENGTH ? px->remaining : MHD_SIZE_UNKNOWN;
  if (px->body == BODY_NONE)
    size = 0;
  /* A long-lived answer (SSE) may move no byte for long, as long as the
   * Forward call's idle timeout allows; MHD's own timeout is then the same
   * bound for a client that stops reading (its socket full, nothing sent):
   * it is cut, and its slot given back, instead of pinning it. */
  MHD_set_connection_option (r->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned) shim.cfg.forward_idle_seconds);
  /* MHD's block comes with the response (a fresh mapping at this size):
   * no larger than the body. */
  size_t block = size < PROXY_BLOCK ? (size_t) size + 1 : PROXY_BLOCK;
  struct MHD_Response *resp = shim_stream_response (r, size, block, body_read, px, body_done);
  if (resp == NULL)
    return out_of_memory (resp, status);
  take_headers (h, resp, false);
  px->relaying = size != 0;
  *status = code;
  r->status_foreign = true;
  return resp;
}

struct MHD_Response *
proxy_handle (shim_req_t *r, unsigned *status)
{
  px_t *px = r->state;
  if (px == NULL)
    {
      px = px_new (r);
      if (px == NULL)
        return shim_detail (503, "Out of memory", status);
      struct MHD_Response *resp = px_open (r, px, status);
      if (resp != NULL)
        return resp;
    }
  struct MHD_Response *resp = px_answer (r, px, status);
  if (!px->relaying)
    px_slot_give_back (px); /* all there is of the answer is here */
  return resp;
}

void
proxy_admit (shim_req_t *r)
{
  const char *uri = r->uri != NULL ? r->uri : "";
  const char *tok = strstr (uri, "/p/");
  char id[SHIM_ID_MAX + 1];
  unsigned port = 0;
  int64_t created = 0;
  if (tok == NULL || ports_token_verify (tok + 3, id, &port, &created) < 0)
    shim_req_fail (r, 403, "Invalid or expired link");
}

void
proxy_cleanup (shim_req_t *r)
{
  px_t *px = r->state;
  r->state = NULL;
  if (px != NULL)
    px_free (px);
}
