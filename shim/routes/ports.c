/* routes/ports: servers inside sandboxes, from the REST side — the list of
 * a sandbox's listening ports (ListPorts), preview links, and the limits on
 * forwarded connections. The HTTP reverse proxy itself is proxy.c.
 *
 * Preview links are stateless: a token names the sandbox, the port, an
 * expiry and the sandbox's creation time, and carries an HMAC-SHA256 over
 * them under a key derived from the shim's bearer secret. Whoever holds a
 * link reaches that one port of that sandbox until it expires, and nothing
 * else: not the API, not another port, not a sandbox created later under
 * the same id (its creation time differs). Rotating the secret revokes
 * every link. The MAC is checked before anything else: a forged or expired
 * token costs no gateway call, so it can neither load the gateway nor
 * count as use of the sandbox (the gateway's Get renews its idle timer; a
 * valid link's traffic does count as use, as the proxy's Forward does).
 *
 * Forwarded connections are capped per sandbox and in all; preview-link
 * traffic (no bearer) may hold only PORTS_LINK_SHARE of either cap, so
 * that link visitors who stop reading cannot lock out the sandbox's owner
 * or other sandboxes' API requests.
 *
 * Threading: the slot table is guarded by slot_mu; the rest is per request.
 */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cleanup.h"
#include "sandbox/v1/sandbox.pb-c.h"
#include "shim/metrics.h"
#include "shim/routes/proxy.h"
#include "shim/routes/routes.h"

/* A link asked for without ttl_seconds lives this long, or
 * SHIM_PREVIEW_MAX_TTL_SECONDS when that is shorter. */
#define PORTS_DEFAULT_TTL 3600
#define PORTS_MAC_B64 43 /* base64url of 32 bytes, unpadded */

/* The share of SHIM_MAX_FORWARDS_PER_SANDBOX and of SHIM_MAX_FORWARDS that
 * preview-link traffic may hold (at least one slot): the rest is kept for
 * callers with the bearer. */
#define PORTS_LINK_SHARE_NUM 3
#define PORTS_LINK_SHARE_DEN 4

/* ---- forwarded-connection slots ------------------------------------------------- */

typedef struct slot_s
{
  char id[SHIM_ID_MAX + 1];
  long n;
  long links; /* of n, held by preview-link traffic */
  struct slot_s *next;
} slot_t;

static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;
static slot_t *slots;
static long slots_total, links_total;

/* What preview links may hold of `cap`. */
static long
link_cap (long cap)
{
  long n = cap * PORTS_LINK_SHARE_NUM / PORTS_LINK_SHARE_DEN;
  return n > 0 ? n : 1;
}

ports_slot_t
ports_slot_take (const char *id, bool link)
{
  pthread_mutex_lock (&slot_mu);
  slot_t *s = slots;
  while (s != NULL && strcmp (s->id, id) != 0)
    s = s->next;
  ports_slot_t got = PORTS_SLOT_TAKEN;
  if (s != NULL
      && (s->n >= shim.cfg.max_forwards_per_sandbox
          || (link && s->links >= link_cap (shim.cfg.max_forwards_per_sandbox))))
    got = PORTS_SLOT_SANDBOX_FULL;
  else if (slots_total >= shim.cfg.max_forwards || (link && links_total >= link_cap (shim.cfg.max_forwards)))
    got = PORTS_SLOT_ALL_FULL;
  else if (s == NULL)
    {
      s = calloc (1, sizeof *s);
      if (s == NULL)
        got = PORTS_SLOT_NO_MEMORY;
      else
        {
          snprintf (s->id, sizeof s->id, "%s", id);
          s->next = slots;
          slots = s;
        }
    }
  if (got == PORTS_SLOT_TAKEN)
    {
      s->n++;
      slots_total++;
      s->links += link;
      links_total += link;
    }
  pthread_mutex_unlock (&slot_mu);
  return got;
}

void
ports_slot_release (const char *id, bool link)
{
  pthread_mutex_lock (&slot_mu);
  for (slot_t **p = &slots; *p != NULL; p = &(*p)->next)
    if (strcmp ((*p)->id, id) == 0)
      {
        slot_t *s = *p;
        slots_total--;
        s->links -= link;
        links_total -= link;
        if (--s->n == 0)
          {
            *p = s->next;
            free (s);
          }
        break;
      }
  pthread_mutex_unlock (&slot_mu);
}

/* ---- tokens --------------------------------------------------------------------- */

/* base64url of the MAC over the link's fields, into out (44 bytes). */
static int
token_mac (const char *id, unsigned port, int64_t expires, int64_t created_ms, char *out)
{
  static const char label[] = "sandbox-shim preview link key v1";
  const char *secret = shim.cfg.secret;
  if (secret == NULL || secret[0] == '\0')
    return -1;
  unsigned char key[32], mac[32];
  unsigned klen = sizeof key, mlen = sizeof mac;
  if (HMAC (EVP_sha256 (), secret, (int) strlen (secret), (const unsigned char *) label, sizeof label - 1, key, &klen)
      == NULL)
    return -1;
  char msg[256];
  int n = snprintf (msg, sizeof msg, "v1\n%s\n%u\n%lld\n%lld", id, port, (long long) expires, (long long) created_ms);
  if (HMAC (EVP_sha256 (), key, (int) klen, (const unsigned char *) msg, (size_t) n, mac, &mlen) == NULL)
    return -1;
  OPENSSL_cleanse (key, sizeof key);
  char b64[48];
  EVP_EncodeBlock ((unsigned char *) b64, mac, (int) mlen);
  for (size_t i = 0; i < PORTS_MAC_B64; i++)
    out[i] = b64[i] == '+' ? '-' : b64[i] == '/' ? '_' : b64[i];
  out[PORTS_MAC_B64] = '\0';
  return 0;
}

int
ports_token_make (const char *id, unsigned port, int64_t expires, int64_t created_ms, char *out)
{
  char mac[PORTS_MAC_B64 + 1];
  if (token_mac (id, port, expires, created_ms, mac) < 0)
    return -1;
  snprintf (out, PORTS_TOKEN_MAX, "%s.%u.%lld.%lld.%s", id, port, (long long) expires, (long long) created_ms, mac);
  return 0;
}

/* The sandbox's creation time from the gateway: 0, or -1 when it is gone. */
static int
sandbox_created (const char *id, int64_t *created_ms, rpc_status_t *st)
{
  Sandbox__V1__GetRequest req = SANDBOX__V1__GET_REQUEST__INIT;
  req.sandbox_id = (char *) id;
  cleanup_message ProtobufCMessage *resp = NULL;
  if (route_unary (id, "/sandbox.v1.Sandbox/Get", &req.base, &sandbox__v1__sandbox_info__descriptor, &resp, st,
                   ROUTE_SHORT_CALL_MS)
      < 0)
    return -1;
  *created_ms = ((Sandbox__V1__SandboxInfo *) resp)->created_at_unix_ms;
  return 0;
}

/* A decimal number of `text` as a whole (no sign, no blank), or -1. */
static long long
whole_number (const char *text)
{
  if (text[0] < '0' || text[0] > '9' || strlen (text) > 18)
    return -1;
  char *end;
  long long v = strtoll (text, &end, 10);
  return *end == '\0' ? v : -1;
}

int
ports_token_verify (const char *text, char *id, unsigned *port, int64_t *created_ms)
{
  size_t len = strcspn (text, "/?");
  char tok[PORTS_TOKEN_MAX];
  if (len == 0 || len >= sizeof tok)
    return -1;
  memcpy (tok, text, len);
  tok[len] = '\0';
  /* <id>.<port>.<expires>.<created>.<mac>: ids have no dots. */
  char *f[5];
  char *save = NULL, *p = tok;
  for (int i = 0; i < 5; i++, p = NULL)
    if ((f[i] = strtok_r (p, ".", &save)) == NULL)
      return -1;
  if (strtok_r (NULL, ".", &save) != NULL || strlen (f[4]) != PORTS_MAC_B64)
    return -1;
  shim_errors_t e;
  shim_errors_init (&e);
  bool id_ok = shim_check_id (f[0], "path", "sandbox_id", &e);
  shim_errors_release (&e);
  long long pt = whole_number (f[1]), exp = whole_number (f[2]), created = whole_number (f[3]);
  if (!id_ok || pt < 1 || pt > 65535 || exp < (long long) time (NULL) || created < 0)
    return -1;
  char mac[PORTS_MAC_B64 + 1];
  if (token_mac (f[0], (unsigned) pt, exp, created, mac) < 0 || CRYPTO_memcmp (mac, f[4], PORTS_MAC_B64) != 0)
    return -1;
  snprintf (id, SHIM_ID_MAX + 1, "%s", f[0]);
  *port = (unsigned) pt;
  *created_ms = created;
  return 0;
}

int
ports_token_check (const char *text, char *id, unsigned *port)
{
  int64_t created = 0, now_created = 0;
  if (ports_token_verify (text, id, port, &created) < 0)
    return -1;
  /* Only now, for a genuine link, is the gateway asked. */
  rpc_status_t st = RPC_STATUS_INIT;
  int rc = sandbox_created (id, &now_created, &st);
  rpc_status_release (&st);
  return rc == 0 && now_created == created ? 0 : -1;
}

/* ---- routes --------------------------------------------------------------------- */

/* The {port} path component: 1..65535, else the 422 body. */
static json_t *
path_port (shim_req_t *r, unsigned *port)
{
  char *end;
  unsigned long p = strtoul (r->pid, &end, 10);
  if (r->pid[0] != '\0' && *end == '\0' && p >= 1 && p <= 65535)
    {
      *port = (unsigned) p;
      return NULL;
    }
  shim_errors_t e;
  shim_errors_init (&e);
  shim_errors_add (&e, "int_parsing", "path", "port", "Input should be a port number from 1 to 65535");
  return shim_errors_take (&e);
}

struct MHD_Response *
route_ports_list (shim_req_t *r, unsigned *status)
{
  Sandbox__V1__ListPortsRequest req = SANDBOX__V1__LIST_PORTS_REQUEST__INIT;
  req.sandbox_id = r->id;
  cleanup_message ProtobufCMessage *m = NULL;
  rpc_status_t st = RPC_STATUS_INIT;
  if (route_unary (r->id, "/sandbox.v1.Sandbox/ListPorts", &req.base, &sandbox__v1__list_ports_response__descriptor,
                   &m, &st, ROUTE_SHORT_CALL_MS)
      < 0)
    {
      metrics_gateway_error (st.code);
      struct MHD_Response *resp = shim_gateway_error (st.code, &st, status);
      rpc_status_release (&st);
      return resp;
    }
  rpc_status_release (&st);
  const Sandbox__V1__ListPortsResponse *resp = (const Sandbox__V1__ListPortsResponse *) m;
  json_t *list = json_array ();
  for (size_t i = 0; i < resp->n_ports; i++)
    {
      const Sandbox__V1__ListeningPort *p = resp->ports[i];
      json_t *o = json_pack ("{s:i, s:s, s:b, s:b}", "port", (int) p->port, "address", p->address, "loopback_only",
                             p->loopback_only, "ipv6", p->ipv6);
      json_object_set_new (o, "pid", p->pid > 0 ? json_integer (p->pid) : json_null ());
      json_array_append_new (list, o);
    }
  return shim_json (json_pack ("{s:s, s:o}", "sandbox_id", r->id, "ports", list), 200, status);
}

/* The body's ttl_seconds (default PORTS_DEFAULT_TTL, at most
 * SHIM_PREVIEW_MAX_TTL_SECONDS), else the 422 body. */
static json_t *
link_ttl (shim_req_t *r, long long *ttl)
{
  *ttl = PORTS_DEFAULT_TTL < shim.cfg.preview_max_ttl ? PORTS_DEFAULT_TTL : shim.cfg.preview_max_ttl;
  shim_errors_t e;
  shim_errors_init (&e);
  json_t *body = r->len > 0 ? json_loadb (r->body, r->len, 0, NULL) : json_object ();
  json_t *v = json_is_object (body) ? json_object_get (body, "ttl_seconds") : NULL;
  if (!json_is_object (body))
    shim_errors_add (&e, "json_invalid", "body", "", "JSON decode error: expected an object");
  else if (v != NULL && !json_is_null (v))
    {
      if (!json_is_integer (v))
        shim_errors_add (&e, "int_type", "body", "ttl_seconds", "Input should be a valid integer");
      else if (json_integer_value (v) < 1 || json_integer_value (v) > shim.cfg.preview_max_ttl)
        shim_errors_add (&e, "less_than_equal", "body", "ttl_seconds",
                         "Input should be from 1 to SHIM_PREVIEW_MAX_TTL_SECONDS");
      else
        *ttl = json_integer_value (v);
    }
  json_decref (body);
  return shim_errors_any (&e) ? shim_errors_take (&e) : (shim_errors_release (&e), NULL);
}

/* The base of the links: SHIM_PUBLIC_URL, else http://<Host> — the Host
 * header of the request that asks for the link (sent with the bearer, so
 * chosen by a caller who holds the secret; set SHIM_PUBLIC_URL when links
 * go to anyone else). */
static char *
link_base (shim_req_t *r)
{
  char *out = NULL;
  if (shim.cfg.public_url != NULL && shim.cfg.public_url[0] != '\0')
    {
      size_t n = strlen (shim.cfg.public_url);
      while (n > 0 && shim.cfg.public_url[n - 1] == '/')
        n--;
      return asprintf (&out, "%.*s", (int) n, shim.cfg.public_url) < 0 ? NULL : out;
    }
  const char *host = MHD_lookup_connection_value (r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
  return asprintf (&out, "http://%s", host != NULL ? host : "localhost") < 0 ? NULL : out;
}

struct MHD_Response *
route_port_link (shim_req_t *r, unsigned *status)
{
  unsigned port = 0;
  long long ttl = 0;
  json_t *bad = path_port (r, &port);
  if (bad == NULL)
    bad = link_ttl (r, &ttl);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  int64_t created = 0;
  rpc_status_t st = RPC_STATUS_INIT;
  if (sandbox_created (r->id, &created, &st) < 0)
    {
      metrics_gateway_error (st.code);
      struct MHD_Response *resp = shim_gateway_error (st.code, &st, status);
      rpc_status_release (&st);
      return resp;
    }
  rpc_status_release (&st);
  int64_t expires = (int64_t) time (NULL) + ttl;
  char token[PORTS_TOKEN_MAX];
  cleanup_free char *base = link_base (r);
  if (base == NULL || ports_token_make (r->id, port, expires, created, token) < 0)
    return shim_detail (503, "Cannot make a link", status);
  cleanup_free char *path = NULL, *url = NULL;
  if (asprintf (&path, "/p/%s/", token) < 0 || asprintf (&url, "%s%s", base, path) < 0)
    return shim_detail (503, "Out of memory", status);
  return shim_json (json_pack ("{s:s, s:s, s:I, s:s, s:i}", "url", url, "path", path, "expires_at",
                               (json_int_t) expires, "sandbox_id", r->id, "port", (int) port),
                    201, status);
}

/* /sandboxes/{id}/ports/{port} without the slash: the proxy's root, so
 * that relative links in its pages resolve under it. */
struct MHD_Response *
route_port_root (shim_req_t *r, unsigned *status)
{
  unsigned port = 0;
  json_t *bad = path_port (r, &port);
  if (bad != NULL)
    return shim_json (bad, 422, status);
  cleanup_free char *loc = NULL;
  if (asprintf (&loc, "/sandboxes/%s/ports/%u/", r->id, port) < 0)
    return shim_detail (503, "Out of memory", status);
  struct MHD_Response *resp = shim_empty (308, status);
  MHD_add_response_header (resp, MHD_HTTP_HEADER_LOCATION, loc);
  return resp;
}
