/* routes/proxy_request: the request head the port proxy sends to the
 * server in a sandbox — the client's method, path and query as sent, its
 * headers minus hop-by-hop ones (the standard set and those its
 * Connection headers list, RFC 9110 §7.6.1) and ours (our bearer,
 * X-Forwarded-*, the body's framing, `Connection: close` or the upgrade
 * asked for). Bounded by the caller's buffer (px_head_t.cap): a head that
 * does not fit is marked `over`, never cut.
 *
 * Threading: the request's connection thread.
 */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "shim/routes/proxy_px.h"

static void head_add (px_head_t *h, const char *fmt, ...) __attribute__ ((format (printf, 2, 3)));

static void
head_add (px_head_t *h, const char *fmt, ...)
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

static enum MHD_Result
collect_conn_names (void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
  (void) kind;
  if (strcasecmp (key, "connection") == 0 && value != NULL)
    http1_conn_names_add (cls, value);
  return MHD_YES;
}

typedef struct copy_s
{
  px_head_t *h;
  bool preview;
  const http1_conn_names_t *named;
} copy_t;

static enum MHD_Result
copy_header (void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
  copy_t *c = cls;
  (void) kind;
  if (http1_hop_by_hop (key) || written_here (key) || http1_conn_names_has (c->named, key))
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

void
px_request_head (shim_req_t *r, px_t *px, const http1_conn_names_t *named, px_head_t *h)
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
  if (xff != NULL && strpbrk (xff, "\r\n") == NULL && !http1_conn_names_has (named, "x-forwarded-for"))
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
  px->upgrade = up != NULL && http1_conn_names_has (named, "upgrade") && strpbrk (up, "\r\n") == NULL;
  if (px->upgrade)
    head_add (h, "Connection: Upgrade\r\nUpgrade: %s\r\n\r\n", up);
  else
    head_add (h, "Connection: close\r\n\r\n");
}

void
px_request_conn_names (shim_req_t *r, http1_conn_names_t *named)
{
  MHD_get_connection_values (r->conn, MHD_HEADER_KIND, collect_conn_names, named);
}
