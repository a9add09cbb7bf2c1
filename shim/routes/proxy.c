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
 * parsed (bounded by PROXY_MAX_HEAD; its hop-by-hop headers dropped the
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
 * Threading: until an upgrade, everything runs on the connection's thread
 * (it sends and receives on the call); after it, the up thread is the
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
#include "shim/metrics.h"
#include "shim/routes/proxy.h"
#include "shim/routes/routes.h"
#include "shim/watchdog.h"

/* The largest request head sent upstream, and response head accepted. */
#define PROXY_MAX_HEAD (64 * 1024)
/* The most header names a message's Connection headers may list; beyond,
 * it is refused (dropping some and forwarding the rest would pass on
 * headers meant for us alone). */
#define PROXY_MAX_CONN_NAMES 32
/* The most bytes a client socket read carries in one frame (upgraded). */
#define PROXY_CHUNK (64 * 1024)
/* The most pieces of a frame written to an upgraded client in one call. */
#define PROXY_IOV 64
/* The most bytes MHD takes from the answer's body at a time (a larger
 * block measured no faster). */
#define PROXY_BLOCK (256 * 1024)
#define PROXY_THREAD_STACK (256 * 1024)
/* The most interim (1xx) answers a server may send before its answer;
 * beyond, 502. */
#define PROXY_MAX_INTERIM 16

typedef enum body_e
{
  BODY_NONE,
  BODY_LENGTH,
  BODY_CHUNKED,
  BODY_EOF,
} body_t;

typedef struct px_s
{
  char id[SHIM_ID_MAX + 1];
  unsigned port;
  bool preview;
  bool slot;     /* holds a forwarded-connection slot */
  bool relaying; /* the answer is the server's, with a body or upgraded */
  rpc_client_call_t *call;
  watch_t *watch;
  bool chunked_up; /* the request body goes upstream re-chunked */
  bool upgrade;    /* the client asked for an upgrade */
  bool head_method;
  frames_t up;  /* upstream bytes: the current frame */
  bool up_end;  /* upstream closed its side (or the call ended) */
  bool up_fail; /* ... abnormally */
  char *head;   /* the response head, and what came after it */
  size_t head_len;
  /* The response body. */
  body_t body;
  uint64_t remaining; /* BODY_LENGTH: bytes left; BODY_CHUNKED: of this chunk */
  int chunk_state;    /* 0 size line, 1 data, 2 CRLF after data, 3 trailers, 4 done */
  /* Upgraded. */
  struct MHD_UpgradeResponseHandle *urh;
  int sock;
  atomic_int threads;
} px_t;

/* ---- upstream bytes -------------------------------------------------------------- */

/* Receives the next frame from upstream: false at its end. */
static bool
up_recv (px_t *px)
{
  if (px->up_end)
    return false;
  err_t err = ERR_INIT;
  grpc_byte_buffer *bb = NULL;
  bool close_write = false;
  int rc = rpc_client_recv_raw (px->call, &bb, &err);
  if (rc > 0 && frames_take (&px->up, bb, &close_write, NULL, &err) < 0)
    {
      rpc_client_cancel (px->call);
      rc = -1;
    }
  err_release (&err);
  if (rc <= 0)
    {
      px->up_end = true;
      px->up_fail = true; /* the call ended before the server closed its side */
      return false;
    }
  px->up_end = close_write;
  return true;
}

/* True when upstream bytes are at hand without waiting for a frame. */
static bool
up_buffered (const px_t *px)
{
  return frames_buffered (&px->up);
}

/* Up to `max` next bytes from upstream at *p (valid while up_buffered, or
 * until the next call): their count, 0 at upstream's end. */
static size_t
up_next (px_t *px, const uint8_t **p, size_t max)
{
  for (;;)
    {
      size_t k = frames_next (&px->up, p, max);
      if (k > 0)
        return k;
      if (!up_recv (px))
        return 0;
    }
}

/* Up to `max` next bytes from upstream copied into buf: at least one
 * unless at upstream's end, then as many as are at hand without waiting. */
static size_t
up_copy (px_t *px, uint8_t *buf, size_t max)
{
  size_t n = 0;
  while (n < max && (n == 0 || up_buffered (px)))
    {
      const uint8_t *p;
      size_t k = up_next (px, &p, max - n);
      if (k == 0)
        break;
      memcpy (buf + n, p, k);
      n += k;
    }
  return n;
}

/* ---- the request upstream -------------------------------------------------------- */

typedef struct head_s
{
  char *buf;
  size_t len, cap;
  bool over;
} head_t;

static void head_add (head_t *h, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

static void
head_add (head_t *h, const char *fmt, ...)
{
  if (h->over)
    return;
  va_list ap;
  va_start (ap, fmt);
  int n = vsnprintf (h->buf + h->len, h->cap - h->len, fmt, ap);
  va_end (ap);
  if (n < 0 || (size_t) n >= h->cap - h->len)
    h->over = true;
  else
    h->len += (size_t) n;
}

static bool
name_in (const char *name, const char *const *names, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (strcasecmp (name, names[i]) == 0)
      return true;
  return false;
}

/* The hop-by-hop headers of RFC 9110 §7.6.1 and their older kin: they
 * describe one connection, never forwarded either way (Upgrade is written
 * again for a WebSocket's upgrade; Transfer-Encoding and Content-Length
 * are the framing, which each side makes for itself). */
static bool
hop_by_hop (const char *name)
{
  static const char *const names[] = {
      "connection", "keep-alive",          "proxy-connection",   "te", "trailer", "transfer-encoding",
      "upgrade",    "proxy-authorization", "proxy-authenticate",
  };
  return name_in (name, names, sizeof names / sizeof names[0]);
}

/* Request headers the shim writes itself (or drops: Expect is answered
 * here). */
static bool
written_here (const char *name)
{
  static const char *const names[] = {
      "host",
      "expect",
      "content-length",
      "x-forwarded-for",
      "x-forwarded-proto",
      "x-forwarded-host",
      "x-forwarded-prefix",
  };
  return name_in (name, names, sizeof names / sizeof names[0]);
}

/* The header names a message's Connection headers list: hop-by-hop for
 * that connection alone (RFC 9110 §7.6.1). Pointers into the headers'
 * values, which outlive it. */
typedef struct conn_names_s
{
  struct
  {
    const char *p;
    size_t len;
  } name[PROXY_MAX_CONN_NAMES];
  size_t n;
  bool over; /* more than PROXY_MAX_CONN_NAMES: the message is refused */
} conn_names_t;

/* Adds the names one Connection header lists ("close, X-A ,x-b"). */
static void
conn_names_add (conn_names_t *c, const char *value)
{
  for (const char *p = value;;)
    {
      p += strspn (p, " \t,");
      size_t len = strcspn (p, " \t,");
      if (len == 0)
        return;
      if (c->n == PROXY_MAX_CONN_NAMES)
        {
          c->over = true;
          return;
        }
      c->name[c->n].p = p;
      c->name[c->n].len = len;
      c->n++;
      p += len;
    }
}

static bool
conn_names_has (const conn_names_t *c, const char *name)
{
  size_t len = strlen (name);
  for (size_t i = 0; i < c->n; i++)
    if (c->name[i].len == len && strncasecmp (c->name[i].p, name, len) == 0)
      return true;
  return false;
}

static enum MHD_Result
collect_conn_names (void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
  (void) kind;
  if (strcasecmp (key, "connection") == 0 && value != NULL)
    conn_names_add (cls, value);
  return MHD_YES;
}

typedef struct copy_s
{
  head_t *h;
  bool preview;
  const conn_names_t *named;
} copy_t;

static enum MHD_Result
copy_header (void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
  copy_t *c = cls;
  (void) kind;
  if (hop_by_hop (key) || written_here (key) || conn_names_has (c->named, key))
    return MHD_YES;
  /* Our bearer stays here; a preview link's visitor's own credentials go on. */
  if (!c->preview && strcasecmp (key, "authorization") == 0)
    return MHD_YES;
  if (strchr (value, '\r') != NULL || strchr (value, '\n') != NULL)
    return MHD_YES;
  head_add (c->h, "%s: %s\r\n", key, value);
  return MHD_YES;
}

/* The client's address as text. */
static void
client_address (shim_req_t *r, char *out, size_t cap)
{
  snprintf (out, cap, "unknown");
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info (r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (ci == NULL || ci->client_addr == NULL)
    return;
  const struct sockaddr *sa = ci->client_addr;
  if (sa->sa_family == AF_INET)
    inet_ntop (AF_INET, &((const struct sockaddr_in *) sa)->sin_addr, out, (socklen_t) cap);
  else if (sa->sa_family == AF_INET6)
    inet_ntop (AF_INET6, &((const struct sockaddr_in6 *) sa)->sin6_addr, out, (socklen_t) cap);
}

/* The target upstream: the request's path after the prefix (its first
 * `skip` components), with the query, as the client sent them; *prefix_len
 * is the prefix's length. */
static const char *
upstream_target (const char *uri, int skip, size_t *prefix_len)
{
  const char *p = uri;
  if (strncmp (p, "http://", 7) == 0 || strncmp (p, "https://", 8) == 0)
    {
      p = strchr (strstr (p, "//") + 2, '/');
      if (p == NULL)
        return NULL;
    }
  const char *start = p;
  for (int i = 0; i < skip && p != NULL; i++)
    p = strchr (p + 1, '/');
  if (p == NULL)
    return NULL;
  *prefix_len = (size_t) (p - start);
  return p;
}

/* The request head for upstream, into h; `named`: the headers the
 * client's Connection headers list. */
static void
build_head (shim_req_t *r, px_t *px, const conn_names_t *named, head_t *h)
{
  const char *uri = r->uri != NULL ? r->uri : "/";
  size_t prefix_len = 0;
  const char *target = upstream_target (uri, px->preview ? 2 : 4, &prefix_len);
  if (target == NULL)
    target = "/";
  const char *start = strncmp (uri, "http", 4) == 0 ? strchr (strstr (uri, "//") + 2, '/') : uri;
  head_add (h, "%s %s HTTP/1.1\r\nHost: localhost:%u\r\n", r->method, target, px->port);
  copy_t c = {.h = h, .preview = px->preview, .named = named};
  MHD_get_connection_values (r->conn, MHD_HEADER_KIND, copy_header, &c);
  char addr[64];
  client_address (r, addr, sizeof addr);
  const char *xff = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, "X-Forwarded-For");
  if (xff != NULL && strpbrk (xff, "\r\n") == NULL && !conn_names_has (named, "x-forwarded-for"))
    head_add (h, "X-Forwarded-For: %s, %s\r\n", xff, addr);
  else
    head_add (h, "X-Forwarded-For: %s\r\n", addr);
  const char *pub = shim.cfg.public_url;
  head_add (h, "X-Forwarded-Proto: %s\r\n", pub != NULL && strncmp (pub, "https:", 6) == 0 ? "https" : "http");
  const char *host = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
  if (host != NULL && strpbrk (host, "\r\n") == NULL)
    head_add (h, "X-Forwarded-Host: %s\r\n", host);
  head_add (h, "X-Forwarded-Prefix: %.*s\r\n", (int) prefix_len, start != NULL ? start : "");
  const char *cl = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  const char *te = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
  if (te != NULL && strcasestr (te, "chunked") != NULL)
    {
      px->chunked_up = true;
      head_add (h, "Transfer-Encoding: chunked\r\n");
    }
  else if (cl != NULL)
    head_add (h, "Content-Length: %llu\r\n", strtoull (cl, NULL, 10));
  const char *up = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_UPGRADE);
  px->upgrade = up != NULL && conn_names_has (named, "upgrade") && strpbrk (up, "\r\n") == NULL;
  if (px->upgrade)
    head_add (h, "Connection: Upgrade\r\nUpgrade: %s\r\n\r\n", up);
  else
    head_add (h, "Connection: close\r\n\r\n");
}

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
  conn_names_t named = {.n = 0};
  MHD_get_connection_values (r->conn, MHD_HEADER_KIND, collect_conn_names, &named);
  if (named.over)
    return shim_detail (400, "Too many header names in Connection", status);
  char buf[PROXY_MAX_HEAD];
  head_t h = {.buf = buf, .cap = sizeof buf};
  build_head (r, px, &named, &h);
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
  px->watch = watch_add (shim_req_fd (r), px->call);
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

static int
send_data (px_t *px, const void *data, size_t len)
{
  Sandbox__V1__ForwardFrame f = SANDBOX__V1__FORWARD_FRAME__INIT;
  f.data.data = (uint8_t *) data;
  f.data.len = len;
  err_t err = ERR_INIT;
  int rc = rpc_client_send (px->call, &f.base, &err);
  err_release (&err);
  return rc;
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
      rc = send_data (px, size, (size_t) n);
      if (rc == 0)
        rc = send_data (px, data, len);
      if (rc == 0)
        rc = send_data (px, "\r\n", 2);
    }
  else
    rc = send_data (px, data, len);
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
  HEAD_TOO_LARGE, /* over PROXY_MAX_HEAD */
  HEAD_NO_MEMORY,
} got_head_t;

/* Reads the response head into px->head (NUL-terminated at its blank
 * line); what follows it becomes the next upstream bytes. */
static got_head_t
read_head (px_t *px)
{
  free (px->head);
  px->head = malloc (PROXY_MAX_HEAD + 1);
  if (px->head == NULL)
    return HEAD_NO_MEMORY;
  size_t len = 0;
  for (;;)
    {
      /* Full without its end: stop here, not read the rest of the stream. */
      if (len == PROXY_MAX_HEAD)
        return HEAD_TOO_LARGE;
      const uint8_t *p;
      size_t k = up_next (px, &p, PROXY_MAX_HEAD - len);
      if (k == 0)
        return HEAD_ENDED;
      memcpy (px->head + len, p, k);
      size_t from = len > 3 ? len - 3 : 0;
      len += k;
      px->head[len] = '\0';
      char *end = memmem (px->head + from, len - from, "\r\n\r\n", 4);
      if (end != NULL)
        {
          size_t head_len = (size_t) (end - px->head) + 4;
          /* The rest is body, from the end of the piece just taken
           * (the head ends inside it): put it back. */
          frames_unread (&px->up, len - head_len);
          *end = '\0';
          px->head_len = head_len;
          return HEAD_OK;
        }
    }
}

/* The status of a head ("HTTP/1.1 200 OK"), 0 when malformed. */
static unsigned
head_status (const char *head)
{
  unsigned code = 0;
  if (strncmp (head, "HTTP/1.", 7) != 0 || sscanf (head + 8, " %3u", &code) != 1 || code < 100 || code > 999)
    return 0;
  return code;
}

/* The next header line of a head being split by strtok_r (the status
 * line already taken): its name and value (leading blanks skipped), cut
 * apart in place; false at the end. Lines without a name are skipped. */
static bool
next_header (char **save, char **name, char **value)
{
  for (char *line; (line = strtok_r (NULL, "\r\n", save)) != NULL;)
    {
      char *colon = strchr (line, ':');
      if (colon == NULL || colon == line)
        continue;
      *colon = '\0';
      *name = line;
      *value = colon + 1 + strspn (colon + 1, " \t");
      return true;
    }
  return false;
}

/* Adds the head's end-to-end headers to `resp` (when not NULL): not the
 * hop-by-hop ones, nor those its Connection headers list (but Upgrade on
 * a switch to it); notes the body's framing. 0; -E2BIG when its
 * Connection headers list more than PROXY_MAX_CONN_NAMES names; -ENOMEM. */
static int
take_headers (px_t *px, struct MHD_Response *resp, bool upgraded)
{
  /* One pass for the Connection headers (their values stay in `conn`),
   * one for the rest. */
  cleanup_free char *conn = strdup (px->head);
  cleanup_free char *head = strdup (px->head);
  if (conn == NULL || head == NULL)
    return -ENOMEM;
  conn_names_t named = {.n = 0};
  char *save = NULL, *name, *value;
  strtok_r (conn, "\r\n", &save); /* the status line */
  while (next_header (&save, &name, &value))
    if (strcasecmp (name, "connection") == 0)
      conn_names_add (&named, value);
  if (named.over)
    return -E2BIG;
  bool chunked = false, length = false;
  uint64_t cl = 0;
  strtok_r (head, "\r\n", &save);
  while (next_header (&save, &name, &value))
    {
      if (strcasecmp (name, "transfer-encoding") == 0)
        chunked = strcasestr (value, "chunked") != NULL;
      else if (strcasecmp (name, "content-length") == 0)
        {
          length = true;
          cl = strtoull (value, NULL, 10);
        }
      bool upgrade = upgraded && strcasecmp (name, "upgrade") == 0;
      if (!upgrade
          && (hop_by_hop (name) || conn_names_has (&named, name) || strcasecmp (name, "content-length") == 0))
        continue;
      if (resp != NULL)
        MHD_add_response_header (resp, name, value);
    }
  px->body = chunked ? BODY_CHUNKED : length ? BODY_LENGTH : BODY_EOF;
  px->remaining = length && !chunked ? cl : 0;
  return 0;
}

/* Reads one line of a chunked body (at most 1 KiB) into `line`. */
static int
chunk_line (px_t *px, char *line, size_t cap)
{
  size_t n = 0;
  for (;;)
    {
      const uint8_t *p;
      if (up_next (px, &p, 1) == 0)
        return -1;
      if (*p == '\n')
        break;
      if (n + 1 >= cap)
        return -1;
      line[n++] = (char) *p;
    }
  if (n > 0 && line[n - 1] == '\r')
    n--;
  line[n] = '\0';
  return 0;
}

/* The next bytes of a chunked body into buf: their count, 0 at its end, -1. */
static ssize_t
read_chunked (px_t *px, char *buf, size_t max)
{
  char line[1024];
  for (;;)
    switch (px->chunk_state)
      {
      case 0:
        if (chunk_line (px, line, sizeof line) < 0)
          return -1;
        char *end;
        px->remaining = strtoull (line, &end, 16);
        if (end == line)
          return -1;
        px->chunk_state = px->remaining == 0 ? 3 : 1;
        break;
      case 1:
        {
          size_t k = up_copy (px, (uint8_t *) buf, px->remaining < max ? px->remaining : max);
          if (k == 0)
            return -1;
          px->remaining -= k;
          if (px->remaining == 0)
            px->chunk_state = 2;
          return (ssize_t) k;
        }
      case 2:
        if (chunk_line (px, line, sizeof line) < 0 || line[0] != '\0')
          return -1;
        px->chunk_state = 0;
        break;
      case 3:
        /* Trailers (dropped) up to the blank line. */
        if (chunk_line (px, line, sizeof line) < 0)
          return -1;
        if (line[0] == '\0')
          px->chunk_state = 4;
        break;
      default: return 0;
      }
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
        size_t k = up_copy (px, (uint8_t *) buf, want);
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

/* ---- upgraded connections ------------------------------------------------------- */

static void
px_free (px_t *px)
{
  watch_remove (px->watch);
  if (px->call != NULL)
    rpc_client_destroy (px->call);
  frames_drop (&px->up);
  if (px->slot)
    ports_slot_release (px->id, px->preview);
  free (px->head);
  free (px);
}

static void
thread_done (px_t *px)
{
  if (atomic_fetch_sub (&px->threads, 1) != 1)
    return;
  MHD_upgrade_action (px->urh, MHD_UPGRADE_ACTION_CLOSE);
  px_free (px);
}

/* The client -> sandbox direction: the call's only sender. */
static void *
up_main (void *arg)
{
  px_t *px = arg;
  char *buf = malloc (PROXY_CHUNK);
  for (;;)
    {
      ssize_t n = buf == NULL ? -1 : recv (px->sock, buf, PROXY_CHUNK, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n > 0 && send_data (px, buf, (size_t) n) == 0)
        continue;
      if (n == 0)
        {
          /* The client closed its side: so does the stream. */
          Sandbox__V1__ForwardFrame f = SANDBOX__V1__FORWARD_FRAME__INIT;
          f.close_write = true;
          err_t err = ERR_INIT;
          if (rpc_client_send (px->call, &f.base, &err) == 0)
            rpc_client_close_send (px->call, &err);
          err_release (&err);
        }
      else
        rpc_client_cancel (px->call); /* the client is gone, or the call is */
      break;
    }
  free (buf);
  thread_done (px);
  return NULL;
}

/* The sandbox -> client direction: the call's only receiver. */
static void *
down_main (void *arg)
{
  px_t *px = arg;
  bool ok = true;
  for (;;)
    {
      /* The frame's pieces at hand, in one send. */
      struct iovec iov[PROXY_IOV];
      size_t n = 0;
      while (n < PROXY_IOV && (n == 0 || up_buffered (px)))
        {
          const uint8_t *p;
          size_t k = up_next (px, &p, SIZE_MAX);
          if (k == 0)
            break;
          iov[n++] = (struct iovec){.iov_base = (void *) p, .iov_len = k};
        }
      if (n == 0)
        break;
      struct msghdr mh = {.msg_iov = iov, .msg_iovlen = n};
      while (ok && mh.msg_iovlen > 0)
        {
          ssize_t w = sendmsg (px->sock, &mh, MSG_NOSIGNAL);
          if (w < 0 && errno == EINTR)
            continue;
          ok = w > 0;
          for (size_t done = ok ? (size_t) w : 0; done > 0;)
            {
              size_t k = done < mh.msg_iov->iov_len ? done : mh.msg_iov->iov_len;
              mh.msg_iov->iov_base = (uint8_t *) mh.msg_iov->iov_base + k;
              mh.msg_iov->iov_len -= k;
              done -= k;
              if (mh.msg_iov->iov_len == 0)
                {
                  mh.msg_iov++;
                  mh.msg_iovlen--;
                }
            }
        }
      if (!ok)
        break;
    }
  /* The server closed its side (or the call ended): so does the client's
   * socket; on failure both ways, which also ends the up thread's read. */
  shutdown (px->sock, ok && !px->up_fail ? SHUT_WR : SHUT_RDWR);
  if (!ok)
    rpc_client_cancel (px->call);
  thread_done (px);
  return NULL;
}

static void
px_upgraded (void *cls, struct MHD_Connection *conn, void *con_cls, const char *extra_in, size_t extra_in_size,
             MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
  px_t *px = cls;
  shim_req_t *r = con_cls;
  r->state = NULL; /* the threads own it now */
  watchdog_stage (conn, STAGE_UPGRADED, false);
  watch_remove (px->watch); /* the socket is ours now; the threads see its end */
  px->watch = NULL;
  px->urh = urh;
  px->sock = sock;
  /* MHD hands the socket over non-blocking; each thread blocks on its way,
   * the down thread's sends at most SHIM_FORWARD_IDLE_SECONDS (a client
   * that stops reading is cut). */
  int fl = fcntl (sock, F_GETFL);
  if (fl >= 0)
    fcntl (sock, F_SETFL, fl & ~O_NONBLOCK);
  struct timeval snd = {.tv_sec = shim.cfg.forward_idle_seconds};
  setsockopt (sock, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof snd);
  if (extra_in_size > 0 && send_data (px, extra_in, extra_in_size) < 0)
    rpc_client_cancel (px->call);
  pthread_attr_t attr;
  pthread_attr_init (&attr);
  pthread_attr_setstacksize (&attr, PROXY_THREAD_STACK);
  pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
  atomic_store (&px->threads, 2);
  pthread_t t;
  if (pthread_create (&t, &attr, down_main, px) != 0)
    {
      rpc_client_cancel (px->call);
      shutdown (sock, SHUT_RDWR);
      atomic_store (&px->threads, 1);
    }
  if (pthread_create (&t, &attr, up_main, px) != 0)
    {
      log_msg (SEV_WARNING, "port proxy: cannot start a thread for an upgraded connection");
      rpc_client_cancel (px->call);
      shutdown (sock, SHUT_RDWR);
      thread_done (px);
    }
  pthread_attr_destroy (&attr);
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

/* The answer when no usable response head came (`got` says why, HEAD_OK:
 * a malformed one). */
static struct MHD_Response *
head_failed (px_t *px, got_head_t got, unsigned *status)
{
  bool client_gone = watch_remove (px->watch);
  px->watch = NULL;
  if (client_gone)
    return shim_detail (499, "Client closed the request", status);
  if (got == HEAD_NO_MEMORY)
    return shim_detail (503, "Out of memory", status);
  if (got == HEAD_TOO_LARGE)
    {
      char msg[96];
      snprintf (msg, sizeof msg, "The server in the sandbox sent a response head over %d KiB", PROXY_MAX_HEAD / 1024);
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
  if (px->chunked_up && send_data (px, "0\r\n\r\n", 5) < 0)
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
      if (got != HEAD_OK || (code = head_status (px->head)) == 0)
        return head_failed (px, got, status);
      if (code < 100 || code >= 200 || code == 101)
        break;
    }
  int rc = take_headers (px, NULL, code == 101);
  if (rc == -E2BIG)
    return shim_detail (502, "The server in the sandbox named too many headers in Connection", status);
  if (rc < 0)
    return shim_detail (503, "Out of memory", status);
  if (code == 101)
    {
      if (!px->upgrade)
        return shim_detail (502, "The server in the sandbox switched protocols unasked", status);
      struct MHD_Response *resp = MHD_create_response_for_upgrade (px_upgraded, px);
      if (resp == NULL || take_headers (px, resp, true) < 0)
        return out_of_memory (resp, status);
      MHD_add_response_header (resp, MHD_HTTP_HEADER_CONNECTION, "Upgrade");
      px->relaying = true;
      *status = 101;
      r->status_foreign = true;
      return resp;
    }
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
  struct MHD_Response *resp = MHD_create_response_from_callback (size, block, body_read, px, body_done);
  body_t body = px->body;
  uint64_t remaining = px->remaining;
  if (resp == NULL || take_headers (px, resp, false) < 0)
    return out_of_memory (resp, status);
  px->body = body;
  px->remaining = remaining;
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
