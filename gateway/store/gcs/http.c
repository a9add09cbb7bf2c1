/* gcs http: libcurl exchanges, header capture and the retry policy (see
 * http.h). The share handle's locks are the only shared state. */
#include "gateway/store/gcs/http.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "common/cleanup.h"
#include "gateway/store/gcs/parse.h"

#define BODY_MAX_DEFAULT (64 * 1024)
#define DESCRIBE_MAX 240
#define RETRY_SLICE_MS 100 /* a retry's wait looks for a cancel this often */

uint64_t
gcs_now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

/* ---- the share handle ---------------------------------------------------- */

static void
share_lock (CURL *h, curl_lock_data data, curl_lock_access access, void *user)
{
  gcs_net_t *net = user;
  if ((int) data >= 0 && data < CURL_LOCK_DATA_LAST)
    pthread_mutex_lock (&net->locks[data]);
}

static void
share_unlock (CURL *h, curl_lock_data data, void *user)
{
  gcs_net_t *net = user;
  if ((int) data >= 0 && data < CURL_LOCK_DATA_LAST)
    pthread_mutex_unlock (&net->locks[data]);
}

int
gcs_net_init (gcs_net_t *net, err_t *err)
{
  for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
    pthread_mutex_init (&net->locks[i], NULL);
  net->share = curl_share_init ();
  if (net->share == NULL)
    return err_make (err, ENOMEM, "create a curl share handle: out of memory");
  if (curl_share_setopt (net->share, CURLSHOPT_LOCKFUNC, share_lock) != CURLSHE_OK
      || curl_share_setopt (net->share, CURLSHOPT_UNLOCKFUNC, share_unlock) != CURLSHE_OK
      || curl_share_setopt (net->share, CURLSHOPT_USERDATA, net) != CURLSHE_OK
      || curl_share_setopt (net->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK
      || curl_share_setopt (net->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK)
    {
      gcs_net_fini (net);
      return err_make (err, EIO, "configure the curl share handle");
    }
  return 0;
}

void
gcs_net_cancel (gcs_net_t *net)
{
  atomic_store (&net->cancelled, true);
}

static bool
net_cancelled (const gcs_net_t *net)
{
  return atomic_load ((atomic_bool *) &net->cancelled);
}

/* curl's progress callback: non-zero aborts the transfer. */
static int
on_progress (void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
  return net_cancelled (user) ? 1 : 0;
}

void
gcs_net_fini (gcs_net_t *net)
{
  if (net->share != NULL)
    curl_share_cleanup (net->share);
  net->share = NULL;
  for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
    pthread_mutex_destroy (&net->locks[i]);
}

/* ---- responses ----------------------------------------------------------- */

void
gcs_resp_clear (gcs_resp_t *resp)
{
  free (resp->body);
  free (resp->location);
  memset (resp, 0, sizeof *resp);
}

void
gcs_resp_header_line (gcs_resp_t *resp, const char *line, size_t len)
{
  long code = 0;
  int st = gcs_parse_status_line (line, len, &code);
  if (st != 0)
    {
      /* A new response (an interim 1xx, or the final one): forget what the
       * previous one said. */
      free (resp->location);
      resp->location = NULL;
      resp->has_range = resp->range_bad = false;
      resp->has_crc = resp->crc_bad = false;
      resp->committed = 0;
      resp->crc = 0;
      resp->headers_done = false;
      resp->status = st > 0 ? code : 0;
      return;
    }
  if (len <= 2 && (len == 0 || line[0] == '\r' || line[0] == '\n'))
    {
      if (resp->status >= 200)
        resp->headers_done = true;
      return;
    }
  const char *v = NULL;
  size_t vlen = 0;
  if (gcs_header_value (line, len, "location", &v, &vlen))
    {
      free (resp->location);
      resp->location = NULL;
      if (vlen > 0 && vlen <= GCS_HEADER_VALUE_MAX)
        resp->location = strndup (v, vlen);
    }
  else if (gcs_header_value (line, len, "range", &v, &vlen))
    {
      uint64_t c = 0;
      if (gcs_parse_range (v, vlen, &c) == 0)
        {
          resp->has_range = true;
          resp->committed = c;
        }
      else
        resp->range_bad = true;
    }
  else if (gcs_header_value (line, len, "x-goog-hash", &v, &vlen))
    {
      uint32_t c = 0;
      int r = gcs_parse_goog_hash_crc32c (v, vlen, &c);
      if (r < 0 || (r > 0 && resp->has_crc && c != resp->crc))
        resp->crc_bad = true;
      else if (r > 0)
        {
          resp->has_crc = true;
          resp->crc = c;
        }
    }
}

static size_t
on_header (char *data, size_t size, size_t n, void *user)
{
  gcs_resp_header_line (user, data, size * n);
  return size * n;
}

int
gcs_resp_body_append (gcs_resp_t *resp, const char *data, size_t len)
{
  size_t room = resp->body_max > resp->body_len ? resp->body_max - resp->body_len : 0;
  size_t take = len < room ? len : room;
  if (take < len)
    resp->body_truncated = true;
  if (take > 0)
    {
      char *nb = realloc (resp->body, resp->body_len + take + 1);
      if (nb == NULL)
        return -1;
      memcpy (nb + resp->body_len, data, take);
      resp->body = nb;
      resp->body_len += take;
      resp->body[resp->body_len] = '\0';
    }
  return 0;
}

static size_t
on_body (char *data, size_t size, size_t n, void *user)
{
  /* Returning less than given fails the transfer (CURLE_WRITE_ERROR). */
  return gcs_resp_body_append (user, data, size * n) < 0 ? 0 : size * n;
}

/* ---- requests ------------------------------------------------------------ */

int
gcs_http_setup (CURL *h, const gcs_net_t *net, const gcs_req_t *req, gcs_resp_t *resp, struct curl_slist **hdrs,
                err_t *err)
{
  gcs_resp_clear (resp);
  resp->body_max = req->body_max != 0 ? req->body_max : BODY_MAX_DEFAULT;
  *hdrs = NULL;

  struct curl_slist *list = NULL;
  for (const struct curl_slist *s = req->headers; s != NULL; s = s->next)
    {
      struct curl_slist *nl = curl_slist_append (list, s->data);
      if (nl == NULL)
        goto oom;
      list = nl;
    }
  /* No "Expect: 100-continue" round trip before bodies. */
  struct curl_slist *nl = curl_slist_append (list, "Expect:");
  if (nl == NULL)
    goto oom;
  list = nl;
  if (req->auth_header != NULL)
    {
      nl = curl_slist_append (list, req->auth_header);
      if (nl == NULL)
        goto oom;
      list = nl;
    }

  curl_easy_reset (h);
  curl_easy_setopt (h, CURLOPT_URL, req->url);
  curl_easy_setopt (h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt (h, CURLOPT_SHARE, net->share);
  curl_easy_setopt (h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt (h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt (h, CURLOPT_CONNECTTIMEOUT, net->connect_timeout_s);
  curl_easy_setopt (h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt (h, CURLOPT_LOW_SPEED_TIME, net->stall_timeout_s);
  if (req->timeout_s > 0)
    curl_easy_setopt (h, CURLOPT_TIMEOUT, req->timeout_s);
  curl_easy_setopt (h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt (h, CURLOPT_USERAGENT, "sandbox-gateway-gcs/1");
  curl_easy_setopt (h, CURLOPT_ERRORBUFFER, resp->errbuf);
  curl_easy_setopt (h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt (h, CURLOPT_HEADERDATA, resp);
  curl_easy_setopt (h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt (h, CURLOPT_WRITEDATA, resp);
  curl_easy_setopt (h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt (h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt (h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt (h, CURLOPT_XFERINFODATA, (void *) net);
  if (strcmp (req->method, "GET") == 0)
    curl_easy_setopt (h, CURLOPT_HTTPGET, 1L);
  else if (strcmp (req->method, "POST") == 0 || strcmp (req->method, "PUT") == 0)
    {
      curl_easy_setopt (h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) req->body_len);
      curl_easy_setopt (h, CURLOPT_POSTFIELDS, req->body != NULL ? req->body : "");
      curl_easy_setopt (h, CURLOPT_CUSTOMREQUEST, req->method);
    }
  else
    curl_easy_setopt (h, CURLOPT_CUSTOMREQUEST, req->method);
  *hdrs = list;
  return 0;

oom:
  curl_slist_free_all (list);
  return err_make (err, ENOMEM, "%s `%s`: out of memory for request headers", req->method, req->url);
}

int
gcs_http_do (CURL *h, const gcs_net_t *net, const gcs_req_t *req, gcs_resp_t *resp, err_t *err)
{
  struct curl_slist *hdrs = NULL;
  if (gcs_http_setup (h, net, req, resp, &hdrs, err) < 0)
    return -1;
  /* Cancelled: not even a connection is made. */
  resp->rc = net_cancelled (net) ? CURLE_ABORTED_BY_CALLBACK : curl_easy_perform (h);
  curl_slist_free_all (hdrs);
  /* The error buffer lives in resp; curl must not write there any more. */
  curl_easy_setopt (h, CURLOPT_ERRORBUFFER, NULL);
  if (resp->rc != CURLE_OK)
    resp->status = 0;
  else if (resp->status == 0)
    {
      long code = 0;
      curl_easy_getinfo (h, CURLINFO_RESPONSE_CODE, &code);
      resp->status = code;
    }
  return 0;
}

bool
gcs_resp_retryable (const gcs_resp_t *resp)
{
  switch (resp->rc)
    {
    case CURLE_OK: return resp->status == 408 || resp->status == 429 || resp->status >= 500;
    /* Failures that trying again will not fix. */
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_OUT_OF_MEMORY:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_WRITE_ERROR:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_TOO_MANY_REDIRECTS: return false;
    default: return true;
    }
}

/* Printable ASCII only, at most `max` characters. */
static void
append_sanitized (char *out, size_t cap, const char *text, size_t max)
{
  size_t o = strlen (out);
  for (size_t i = 0; text[i] != '\0' && i < max && o + 1 < cap; i++)
    {
      unsigned char c = (unsigned char) text[i];
      out[o++] = (c >= 0x20 && c < 0x7f) ? (char) c : ' ';
    }
  out[o] = '\0';
}

/* The message inside a JSON error body: {"error": {"message": …}} (the
 * storage API) or {"error": "…", "error_description": "…"} (OAuth). */
static char *
json_error_text (const char *body, size_t len)
{
  json_error_t jerr;
  json_t *root = json_loadb (body, len, 0, &jerr);
  if (root == NULL)
    return NULL;
  char *text = NULL;
  json_t *e = json_object_get (root, "error");
  if (json_is_object (e) && json_is_string (json_object_get (e, "message")))
    text = strdup (json_string_value (json_object_get (e, "message")));
  else if (json_is_string (e))
    {
      const char *desc = json_string_value (json_object_get (root, "error_description"));
      if (asprintf (&text, "%s%s%s", json_string_value (e), desc != NULL ? ": " : "", desc != NULL ? desc : "") < 0)
        text = NULL;
    }
  json_decref (root);
  return text;
}

char *
gcs_resp_describe (const gcs_resp_t *resp)
{
  char out[DESCRIBE_MAX + 64] = "";
  if (resp->rc == CURLE_ABORTED_BY_CALLBACK)
    return strdup ("cancelled: the gateway is shutting down");
  if (resp->rc != CURLE_OK)
    {
      append_sanitized (out, sizeof out, "connection failed: ", 32);
      append_sanitized (out, sizeof out, resp->errbuf[0] != '\0' ? resp->errbuf : curl_easy_strerror (resp->rc),
                        DESCRIBE_MAX);
      return strdup (out);
    }
  char head[32];
  int n = snprintf (head, sizeof head, "HTTP %ld", resp->status);
  if (n < 0)
    return NULL;
  append_sanitized (out, sizeof out, head, sizeof head);
  if (resp->body != NULL && resp->body_len > 0)
    {
      cleanup_free char *text = json_error_text (resp->body, resp->body_len);
      append_sanitized (out, sizeof out, ": ", 2);
      append_sanitized (out, sizeof out, text != NULL ? text : resp->body, DESCRIBE_MAX);
    }
  return strdup (out);
}

/* ---- retries ------------------------------------------------------------- */

void
gcs_retry_init (gcs_retry_t *r, const gcs_net_t *net)
{
  memset (r, 0, sizeof *r);
  r->net = net;
}

void
gcs_retry_reset (gcs_retry_t *r)
{
  gcs_retry_init (r, r->net);
}

double
gcs_retry_elapsed_s (const gcs_retry_t *r)
{
  return r->started_ms == 0 ? 0.0 : (double) (gcs_now_ms () - r->started_ms) / 1000.0;
}

int
gcs_retry_wait (gcs_retry_t *r)
{
  if (net_cancelled (r->net))
    return -1;
  uint64_t now = gcs_now_ms ();
  if (r->started_ms == 0)
    {
      r->started_ms = now;
      r->delay_ms = r->net->backoff_initial_ms > 0 ? r->net->backoff_initial_ms : 1;
    }
  uint64_t spent = now - r->started_ms;
  if (spent >= r->net->retry_budget_ms)
    return -1;
  uint64_t left = r->net->retry_budget_ms - spent;
  /* Half the delay plus up to the other half at random ("equal jitter"). */
  uint64_t sleep_ms = r->delay_ms / 2 + arc4random_uniform (r->delay_ms / 2 + 1);
  if (sleep_ms > left)
    sleep_ms = left;
  uint64_t next = (uint64_t) r->delay_ms * 2;
  r->delay_ms = (unsigned) (next < r->net->backoff_max_ms ? next : r->net->backoff_max_ms);
  r->attempts++;
  /* In slices, so that a cancel ends the wait. */
  for (uint64_t slept = 0; slept < sleep_ms; slept += RETRY_SLICE_MS)
    {
      if (net_cancelled (r->net))
        return -1;
      uint64_t ms = sleep_ms - slept < RETRY_SLICE_MS ? sleep_ms - slept : RETRY_SLICE_MS;
      struct timespec ts = {0, (long) ms * 1000000L};
      while (nanosleep (&ts, &ts) < 0 && errno == EINTR)
        ;
    }
  return 0;
}
