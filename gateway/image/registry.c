/* image/registry: see registry.h. One request is one curl easy handle,
 * made and freed per request (pulls are rare next to what they fetch). */
#include "gateway/image/registry.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/cleanup.h"

struct img_reg_s
{
  char *host, *repo, *basic_b64, *image, *plain_hosts, *ca_file;
  bool insecure;
  int64_t deadline_mono_ms;
  img_cancelled_fn cancelled;
  void *cancel_ctx;
  char *token; /* a bearer token, once one was granted */
  bool use_basic;
};

/* One request's answer. */
typedef struct reg_resp_s
{
  CURL *h;
  long status;
  char www_auth[IMG_HEADER_MAX];
  char location[IMG_HEADER_MAX];
  char content_type[IMG_HEADER_MAX];
  uint64_t max, got;
  bool too_big, sink_failed;
  img_sink_fn sink;
  void *sink_ctx;
  const img_reg_t *reg;
  char errbuf[CURL_ERROR_SIZE];
} reg_resp_t;

static int64_t
mono_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *
xstrdup (const char *s)
{
  return s != NULL ? strdup (s) : NULL;
}

int
img_reg_new (const img_reg_opts_t *o, img_reg_t **out, err_t *err)
{
  img_reg_t *r = calloc (1, sizeof *r);
  if (r == NULL)
    return err_make (err, ENOMEM, "out of memory");
  r->host = xstrdup (o->host);
  r->repo = xstrdup (o->repo);
  r->basic_b64 = xstrdup (o->basic_b64);
  r->image = xstrdup (o->image);
  r->insecure = o->insecure;
  r->plain_hosts = xstrdup (o->plain_hosts);
  r->ca_file = xstrdup (o->ca_file);
  r->deadline_mono_ms = o->deadline_mono_ms;
  r->cancelled = o->cancelled;
  r->cancel_ctx = o->cancel_ctx;
  if (r->host == NULL || r->repo == NULL || r->image == NULL || (o->basic_b64 != NULL && r->basic_b64 == NULL)
      || (o->plain_hosts != NULL && r->plain_hosts == NULL) || (o->ca_file != NULL && r->ca_file == NULL))
    {
      img_reg_free (r);
      return err_make (err, ENOMEM, "out of memory");
    }
  *out = r;
  return 0;
}

void
img_reg_free (img_reg_t *r)
{
  if (r == NULL)
    return;
  free (r->host);
  free (r->repo);
  free (r->basic_b64);
  free (r->image);
  free (r->plain_hosts);
  free (r->ca_file);
  free (r->token);
  free (r);
}

/* Keeps header `name`'s value (trimmed, truncated to the buffer). */
static void
keep_header (const char *line, size_t len, const char *name, char *dst)
{
  size_t n = strlen (name);
  if (len <= n || strncasecmp (line, name, n) != 0)
    return;
  const char *v = line + n;
  size_t vl = len - n;
  while (vl > 0 && (*v == ' ' || *v == '\t'))
    v++, vl--;
  while (vl > 0 && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
    vl--;
  if (vl >= IMG_HEADER_MAX)
    vl = IMG_HEADER_MAX - 1;
  memcpy (dst, v, vl);
  dst[vl] = '\0';
}

static size_t
on_header (char *line, size_t size, size_t n, void *ctx)
{
  reg_resp_t *resp = ctx;
  size_t len = size * n;
  if (len >= 5 && strncmp (line, "HTTP/", 5) == 0)
    resp->www_auth[0] = resp->location[0] = resp->content_type[0] = '\0'; /* a new answer */
  keep_header (line, len, "www-authenticate:", resp->www_auth);
  keep_header (line, len, "location:", resp->location);
  keep_header (line, len, "content-type:", resp->content_type);
  return len;
}

static size_t
on_body (char *data, size_t size, size_t n, void *ctx)
{
  reg_resp_t *resp = ctx;
  size_t len = size * n;
  long status = 0;
  curl_easy_getinfo (resp->h, CURLINFO_RESPONSE_CODE, &status);
  uint64_t cap = status == 200 ? resp->max : IMG_SMALL_BODY_MAX;
  if (resp->got + len > cap)
    {
      resp->too_big = status == 200;
      return 0;
    }
  resp->got += len;
  if (status != 200)
    return len; /* an error body: dropped */
  if (resp->sink (resp->sink_ctx, (const uint8_t *) data, len) < 0)
    {
      resp->sink_failed = true;
      return 0;
    }
  return len;
}

static int
on_progress (void *ctx, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
  (void) dt, (void) dn, (void) ut, (void) un;
  const img_reg_t *r = ctx;
  return r->cancelled != NULL && r->cancelled (r->cancel_ctx) ? 1 : 0;
}

/* One GET of `url` with `auth` (a whole header line, or NULL). 0 with
 * resp->status set; -1 with *err for a transport failure. */
static int
request (const img_reg_t *r, const char *url, const char *accept, const char *auth, reg_resp_t *resp, err_t *err)
{
  int64_t left = r->deadline_mono_ms - mono_ms ();
  if (left <= 0)
    return err_make (err, ETIMEDOUT, "image `%s`: the pull's deadline passed", r->image);
  CURL *h = curl_easy_init ();
  if (h == NULL)
    return err_make (err, ENOMEM, "image `%s`: curl_easy_init", r->image);
  struct curl_slist *hdrs = NULL, *tmp = NULL;
  char line[IMG_HEADER_MAX + 32];
  if (accept != NULL)
    {
      snprintf (line, sizeof line, "Accept: %s", accept);
      hdrs = curl_slist_append (hdrs, line);
    }
  if (auth != NULL && (tmp = curl_slist_append (hdrs, auth)) != NULL)
    hdrs = tmp;
  resp->h = h;
  resp->status = 0;
  resp->got = 0;
  resp->too_big = resp->sink_failed = false;
  resp->errbuf[0] = '\0';
  curl_easy_setopt (h, CURLOPT_URL, url);
  curl_easy_setopt (h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt (h, CURLOPT_PROTOCOLS_STR, r->insecure ? "http,https" : "https");
  curl_easy_setopt (h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt (h, CURLOPT_CONNECTTIMEOUT, (long) IMG_CONNECT_SECONDS);
  curl_easy_setopt (h, CURLOPT_LOW_SPEED_LIMIT, (long) IMG_LOW_SPEED_BYTES);
  curl_easy_setopt (h, CURLOPT_LOW_SPEED_TIME, (long) IMG_LOW_SPEED_SECONDS);
  curl_easy_setopt (h, CURLOPT_TIMEOUT_MS, (long) left);
  curl_easy_setopt (h, CURLOPT_USERAGENT, "sandbox-gateway-image/1");
  if (r->ca_file != NULL)
    curl_easy_setopt (h, CURLOPT_CAINFO, r->ca_file); /* SANDBOX_REGISTRY_CA instead of the system's */
  curl_easy_setopt (h, CURLOPT_ERRORBUFFER, resp->errbuf);
  curl_easy_setopt (h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt (h, CURLOPT_HEADERDATA, resp);
  curl_easy_setopt (h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt (h, CURLOPT_WRITEDATA, resp);
  curl_easy_setopt (h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt (h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt (h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt (h, CURLOPT_XFERINFODATA, (void *) r);
  CURLcode rc = curl_easy_perform (h);
  curl_easy_getinfo (h, CURLINFO_RESPONSE_CODE, &resp->status);
  curl_easy_cleanup (h);
  curl_slist_free_all (hdrs);
  resp->h = NULL;
  if (resp->too_big)
    return err_make (err, EINVAL, "image `%s`: `%s` is larger than its cap of %llu bytes", r->image, url,
                     (unsigned long long) resp->max);
  if (resp->sink_failed)
    return err_make (err, EINVAL, "image `%s`: `%s` was refused while it was read", r->image, url);
  if (rc == CURLE_ABORTED_BY_CALLBACK)
    return err_make (err, ECANCELED, "image `%s`: the pull was cancelled", r->image);
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return err_make (err, ETIMEDOUT, "image `%s`: `%s` did not answer in time (deadline, or slower than %d bytes/s)",
                     r->image, url, IMG_LOW_SPEED_BYTES);
  if (rc != CURLE_OK)
    return err_make (err, EREMOTEIO, "image `%s`: GET `%s`: %s", r->image, url,
                     resp->errbuf[0] != '\0' ? resp->errbuf : curl_easy_strerror (rc));
  return 0;
}

/* The value of `key` in a challenge's `key="value"` list, into dst. */
static bool
challenge_param (const char *ch, const char *key, char *dst, size_t cap)
{
  size_t kl = strlen (key);
  for (const char *p = ch; (p = strcasestr (p, key)) != NULL; p += kl)
    {
      if ((p != ch && p[-1] != ' ' && p[-1] != ',') || strncmp (p + kl, "=\"", 2) != 0)
        continue;
      const char *v = p + kl + 2, *end = strchr (v, '"');
      if (end == NULL || (size_t) (end - v) >= cap)
        return false;
      memcpy (dst, v, (size_t) (end - v));
      dst[end - v] = '\0';
      return true;
    }
  return false;
}

typedef struct membuf_s
{
  char data[IMG_SMALL_BODY_MAX + 1];
  size_t len;
} membuf_t;

static int
to_membuf (void *ctx, const uint8_t *data, size_t len)
{
  membuf_t *m = ctx;
  memcpy (m->data + m->len, data, len); /* the cap is the buffer's */
  m->len += len;
  return 0;
}

bool
img_reg_host_listed (const char *list, const char *host)
{
  size_t hl = strlen (host);
  for (const char *p = list; p != NULL && *p;)
    {
      const char *end = strchr (p, ',');
      size_t n = end != NULL ? (size_t) (end - p) : strlen (p);
      while (n > 0 && *p == ' ')
        p++, n--;
      if (n == hl && strncmp (p, host, n) == 0)
        return true;
      p = end != NULL ? end + 1 : NULL;
    }
  return false;
}

/* Whether the gateway may GET `url` for this registry: https anywhere,
 * plain http only from an insecure registry and only to a host of
 * SANDBOX_INSECURE_REGISTRIES (a registry must not steer the gateway to
 * its own loopback or network neighbours). */
static bool
url_allowed (const img_reg_t *r, const char *url)
{
  if (strncmp (url, "https://", 8) == 0)
    return true;
  if (!r->insecure || strncmp (url, "http://", 7) != 0)
    return false;
  const char *h = url + 7;
  size_t n = strcspn (h, "/?#");
  char host[256];
  if (n == 0 || n >= sizeof host || memchr (h, '@', n) != NULL)
    return false;
  memcpy (host, h, n);
  host[n] = '\0';
  return img_reg_host_listed (r->plain_hosts, host);
}

/* The bearer-token flow: GET realm?service=…&scope=… (with the Basic
 * credentials when there are some), its "token" or "access_token". */
static int
fetch_token (img_reg_t *r, const char *challenge, err_t *err)
{
  char realm[IMG_HEADER_MAX], service[512] = "", scope[1024] = "";
  if (!challenge_param (challenge, "realm", realm, sizeof realm))
    return err_make (err, EREMOTEIO, "image `%s`: a bearer challenge without a realm", r->image);
  challenge_param (challenge, "service", service, sizeof service);
  if (!challenge_param (challenge, "scope", scope, sizeof scope))
    snprintf (scope, sizeof scope, "repository:%s:pull", r->repo);
  if (!url_allowed (r, realm))
    return err_make (err, EREMOTEIO,
                     "image `%s`: the token realm `%s` is neither https nor a host of SANDBOX_INSECURE_REGISTRIES",
                     r->image, realm);
  CURL *esc = curl_easy_init ();
  if (esc == NULL)
    return err_make (err, ENOMEM, "out of memory");
  char *s_service = curl_easy_escape (esc, service, 0), *s_scope = curl_easy_escape (esc, scope, 0);
  cleanup_free char *url = NULL;
  int n = s_service != NULL && s_scope != NULL
              ? asprintf (&url, "%s%sservice=%s&scope=%s", realm, strchr (realm, '?') ? "&" : "?", s_service, s_scope)
              : -1;
  curl_free (s_service);
  curl_free (s_scope);
  curl_easy_cleanup (esc);
  if (n < 0)
    return err_make (err, ENOMEM, "out of memory");
  cleanup_free membuf_t *m = calloc (1, sizeof *m);
  if (m == NULL)
    return err_make (err, ENOMEM, "out of memory");
  char auth[IMG_HEADER_MAX];
  if (r->basic_b64 != NULL)
    snprintf (auth, sizeof auth, "Authorization: Basic %s", r->basic_b64);
  reg_resp_t resp = {.max = IMG_SMALL_BODY_MAX, .sink = to_membuf, .sink_ctx = m, .reg = r};
  if (request (r, url, "application/json", r->basic_b64 != NULL ? auth : NULL, &resp, err) < 0)
    return -1;
  if (resp.status != 200)
    return err_make (err, EREMOTEIO, "image `%s`: the token service `%s` answered %ld", r->image, realm, resp.status);
  json_error_t jerr;
  json_t *doc = json_loadb (m->data, m->len, 0, &jerr);
  const char *tok = json_string_value (json_object_get (doc, "token"));
  if (tok == NULL)
    tok = json_string_value (json_object_get (doc, "access_token"));
  if (tok == NULL || strlen (tok) > IMG_HEADER_MAX - 64 || strpbrk (tok, "\r\n") != NULL)
    {
      json_decref (doc);
      return err_make (err, EREMOTEIO, "image `%s`: the token service `%s` gave no usable token", r->image, realm);
    }
  free (r->token);
  r->token = strdup (tok);
  json_decref (doc);
  return r->token != NULL ? 0 : err_make (err, ENOMEM, "out of memory");
}

/* The Authorization header line for the registry, or NULL. */
static const char *
auth_line (const img_reg_t *r, char *buf, size_t cap)
{
  if (r->token != NULL)
    snprintf (buf, cap, "Authorization: Bearer %s", r->token);
  else if (r->use_basic && r->basic_b64 != NULL)
    snprintf (buf, cap, "Authorization: Basic %s", r->basic_b64);
  else
    return NULL;
  return buf;
}

/* "scheme://host[:port]" of `url`, into dst (empty when it has none). */
static void
origin_of (const char *url, char *dst, size_t cap)
{
  const char *p = strstr (url, "://");
  const char *end = p != NULL ? strchr (p + 3, '/') : NULL;
  size_t n = p == NULL ? 0 : end != NULL ? (size_t) (end - url) : strlen (url);
  if (n >= cap)
    n = 0;
  memcpy (dst, url, n);
  dst[n] = '\0';
}

/* Answers to 401: a challenge met once (token or Basic), then the
 * request again. 1 retry, 0 no way to authenticate (err set), -1 *err. */
static int
authenticate (img_reg_t *r, const reg_resp_t *resp, err_t *err)
{
  if (strncasecmp (resp->www_auth, "Bearer ", 7) == 0)
    return fetch_token (r, resp->www_auth, err) < 0 ? -1 : 1;
  if (strncasecmp (resp->www_auth, "Basic", 5) == 0 && r->basic_b64 != NULL && !r->use_basic)
    {
      r->use_basic = true;
      return 1;
    }
  return err_make (err, EREMOTEIO, "image `%s`: the registry `%s` refused access (401%s)", r->image, r->host,
                   r->basic_b64 == NULL ? ", and SANDBOX_REGISTRY_AUTH_FILE gives no credentials for it" : "");
}

int
img_reg_get (img_reg_t *r, const char *kind, const char *ref, const char *accept, uint64_t max, img_sink_fn sink,
             void *ctx, char *content_type, err_t *err)
{
  cleanup_free char *url = NULL;
  if (asprintf (&url, "%s://%s/v2/%s/%s/%s", r->insecure ? "http" : "https", r->host, r->repo, kind, ref) < 0)
    return err_make (err, ENOMEM, "out of memory");
  char origin[512], here[512], auth[IMG_HEADER_MAX + 64];
  origin_of (url, origin, sizeof origin);
  cleanup_free reg_resp_t *resp = calloc (1, sizeof *resp);
  if (resp == NULL)
    return err_make (err, ENOMEM, "out of memory");
  resp->max = max;
  resp->sink = sink;
  resp->sink_ctx = ctx;
  resp->reg = r;
  int auths = 0;
  for (int hops = 0; hops <= IMG_MAX_REDIRECTS;)
    {
      /* The registry's credentials go to the registry only. */
      origin_of (url, here, sizeof here);
      const char *a = strcmp (here, origin) == 0 ? auth_line (r, auth, sizeof auth) : NULL;
      if (request (r, url, accept, a, resp, err) < 0)
        return -1;
      if (resp->status == 401 && strcmp (here, origin) == 0 && auths++ < 2)
        {
          if (authenticate (r, resp, err) < 0)
            return -1;
          continue;
        }
      if (resp->status >= 300 && resp->status < 400 && resp->location[0] != '\0')
        {
          char *next = NULL;
          if (strncmp (resp->location, "http", 4) == 0)
            next = strdup (resp->location);
          else if (resp->location[0] == '/' && asprintf (&next, "%s%s", here, resp->location) < 0)
            next = NULL;
          if (next == NULL)
            return err_make (err, EREMOTEIO, "image `%s`: a redirect to `%s`", r->image, resp->location);
          if (!url_allowed (r, next))
            {
              err_make (err, EREMOTEIO,
                        "image `%s`: a redirect to `%s`, neither https nor a host of SANDBOX_INSECURE_REGISTRIES",
                        r->image, next);
              free (next);
              return -1;
            }
          free (url);
          url = next;
          hops++;
          continue;
        }
      if (resp->status == 200)
        {
          if (content_type != NULL)
            snprintf (content_type, IMG_HEADER_MAX, "%s", resp->content_type);
          return 0;
        }
      return err_make (err, EREMOTEIO, "image `%s`: GET %s `%s` answered %ld", r->image, kind, ref, resp->status);
    }
  return err_make (err, EREMOTEIO, "image `%s`: more than %d redirects for %s `%s`", r->image, IMG_MAX_REDIRECTS,
                   kind, ref);
}
