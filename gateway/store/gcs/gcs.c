/* gcs: the snapshot store on Google Cloud Storage (see gcs.h): resumable
 * uploads with one chunk buffered per writer, streamed and CRC32C-checked
 * downloads, object metadata and deletion, all with bounded retries.
 *
 * Not here: HTTP mechanics and the retry policy (http.c), tokens (auth.c),
 * header parsing and CRC32C (parse.c).
 *
 * Threading: the store's fields never change after gcs_store_new; its token
 * cache and curl share handle lock themselves. Each writer and reader has
 * its own curl handle and belongs to the thread that opened it.
 */
#include "gateway/store/gcs/gcs.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/store/gcs/auth.h"
#include "gateway/store/gcs/http.h"
#include "gateway/store/gcs/parse.h"

#define OBJECT_NAME_MAX 1024          /* GCS limit, in bytes */
#define CHUNK_SIZE_MAX (256u * 1024u * 1024u)
#define SMALL_REQUEST_TIMEOUT_S 60    /* metadata, delete, upload start, status query */
#define CANCEL_TIMEOUT_S 5            /* best-effort session cancel */
#define CHUNK_TIMEOUT_BASE_S 300      /* a chunk PUT: this plus its size at 32 KiB/s */
#define READ_PIECE_MAX (1024u * 1024u) /* bigger write-callback pieces are refused */

typedef struct gcs_store_s
{
  snap_store_t base; /* first: a snap_store_t * is a gcs_store_t * */
  char *bucket;
  char *bucket_esc;  /* URL-escaped */
  char *endpoint;    /* no trailing '/' */
  size_t chunk_size;
  gcs_net_t net;
  bool net_ready;
  gcs_auth_t *auth;  /* NULL: no credentials (emulator) */
} gcs_store_t;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void
curl_init (void)
{
  curl_init_rc = curl_global_init (CURL_GLOBAL_DEFAULT);
}

/* ---- helpers ------------------------------------------------------------- */

static int
check_object_name (const char *object, err_t *err)
{
  if (object == NULL || object[0] == '\0')
    return err_make (err, EINVAL, "GCS object name is empty");
  size_t n = strlen (object);
  if (n > OBJECT_NAME_MAX)
    return err_make (err, EINVAL, "GCS object name `%.64s…` is longer than %d bytes", object, OBJECT_NAME_MAX);
  if (strpbrk (object, "\r\n") != NULL)
    return err_make (err, EINVAL, "GCS object name `%.64s` contains a line break", object);
  return 0;
}

/* URL-escapes `s` into a malloc'd string (curl's escaping, then copied so
 * that free() is right), or NULL. */
static char *
escape (const char *s)
{
  char *e = curl_easy_escape (NULL, s, 0);
  if (e == NULL)
    return NULL;
  char *copy = strdup (e);
  curl_free (e);
  return copy;
}

/* "{endpoint}/storage/v1/b/{bucket}/o/{object}{suffix}" or NULL. */
static char *
object_url (const gcs_store_t *s, const char *object, const char *suffix)
{
  cleanup_free char *esc = escape (object);
  char *url = NULL;
  if (esc == NULL || asprintf (&url, "%s/storage/v1/b/%s/o/%s%s", s->endpoint, s->bucket_esc, esc, suffix) < 0)
    return NULL;
  return url;
}

/* errno for a final (non-retryable) HTTP status. */
static int
status_errno (long status)
{
  switch (status)
    {
    case 401:
    case 403:
      return EACCES;
    case 404:
      return ENOENT;
    default:
      return EIO;
    }
}

/* One exchange with the store's credentials: when the API answers 401 with
 * a cached token, the token is dropped and the exchange tried once more.
 * 0 when performed (look at resp), -1 with *err when credentials or set-up
 * failed. */
static int
authed_do (gcs_store_t *s, CURL *h, gcs_req_t *req, gcs_resp_t *resp, err_t *err)
{
  for (int attempt = 0;; attempt++)
    {
      char *auth = NULL;
      if (gcs_auth_header (s->auth, &auth, err) < 0)
        return -1;
      req->auth_header = auth;
      int rc = gcs_http_do (h, &s->net, req, resp, err);
      req->auth_header = NULL;
      gcs_auth_header_free (auth);
      if (rc < 0)
        return -1;
      if (resp->rc == CURLE_OK && resp->status == 401 && s->auth != NULL && attempt == 0)
        {
          gcs_auth_invalidate (s->auth);
          continue;
        }
      return 0;
    }
}

static void
log_retry (const char *what, const char *step, const gcs_resp_t *resp)
{
  cleanup_free char *d = gcs_resp_describe (resp);
  log_fields (SEV_WARNING, json_pack ("{s:s, s:s, s:s}", "object", what, "step", step, "failure", d ? d : "?"),
              "GCS request failed; retrying");
}

/* Performs `req` until it gets an answer that retrying cannot change. 0 with
 * that answer in *resp (any status: the caller decides), *retried set when
 * an earlier attempt failed; -1 with *err when the retry budget ran out
 * (ETIMEDOUT, naming `what`, `step` and the last failure). */
static int
do_with_retry (gcs_store_t *s, CURL *h, gcs_req_t *req, gcs_resp_t *resp, const char *what, const char *step,
               bool *retried, err_t *err)
{
  gcs_retry_t retry;
  gcs_retry_init (&retry, &s->net);
  if (retried != NULL)
    *retried = false;
  for (;;)
    {
      if (authed_do (s, h, req, resp, err) < 0)
        return -1;
      if (!gcs_resp_retryable (resp))
        return 0;
      if (retried != NULL)
        *retried = true;
      log_retry (what, step, resp);
      if (gcs_retry_wait (&retry) < 0)
        {
          cleanup_free char *d = gcs_resp_describe (resp);
          return err_make (err, ETIMEDOUT, "%s `%s`: gave up after %.1f s of retries; last failure: %s", step, what,
                           gcs_retry_elapsed_s (&retry), d ? d : "?");
        }
    }
}

/* The error for a final unexpected answer. */
static int
fail_status (const gcs_resp_t *resp, const char *step, const char *what, err_t *err)
{
  cleanup_free char *d = gcs_resp_describe (resp);
  int status = resp->rc != CURLE_OK ? EIO : status_errno (resp->status);
  return err_make (err, status, "%s `%s`: %s", step, what, d ? d : "?");
}

/* ---- writer -------------------------------------------------------------- */

typedef struct gcs_writer_s
{
  gcs_store_t *store;
  char *what;       /* "gs://bucket/object", for messages */
  char *object;
  CURL *h;
  char *session;    /* the resumable session URI */
  uint8_t *buf;     /* one chunk: the bytes from offset `base` not yet committed */
  size_t len;
  uint64_t base;    /* bytes the server has committed */
  uint32_t crc;     /* CRC32C of everything written */
  bool failed;
} gcs_writer_t;

static void
writer_free (gcs_writer_t *w)
{
  if (w == NULL)
    return;
  if (w->h != NULL)
    curl_easy_cleanup (w->h);
  free (w->what);
  free (w->object);
  free (w->session);
  free (w->buf);
  free (w);
}

/* Best effort: tells the server to drop the session (no retries). */
static void
writer_cancel (gcs_writer_t *w)
{
  if (w->session == NULL || w->h == NULL)
    return;
  gcs_req_t req = {.method = "DELETE", .url = w->session, .timeout_s = CANCEL_TIMEOUT_S};
  gcs_resp_t resp = {0};
  err_t err = ERR_INIT;
  if (authed_do (w->store, w->h, &req, &resp, &err) < 0)
    err_release (&err);
  gcs_resp_clear (&resp);
}

static int
gcs_writer_open (snap_store_t *store, const char *object, snap_writer_t **out, err_t *err)
{
  gcs_store_t *s = (gcs_store_t *) store;
  if (check_object_name (object, err) < 0)
    return -1;
  gcs_writer_t *w = calloc (1, sizeof *w);
  if (w == NULL)
    return err_make (err, ENOMEM, "upload `%s`: out of memory", object);
  w->store = s;
  w->object = strdup (object);
  if (asprintf (&w->what, "gs://%s/%s", s->bucket, object) < 0)
    w->what = NULL;
  w->buf = malloc (s->chunk_size);
  w->h = curl_easy_init ();
  cleanup_free char *esc = escape (object);
  cleanup_free char *url = NULL;
  if (esc == NULL
      || asprintf (&url, "%s/upload/storage/v1/b/%s/o?uploadType=resumable&name=%s", s->endpoint, s->bucket_esc, esc)
             < 0)
    url = NULL;
  json_t *meta = json_pack ("{s:s, s:s}", "name", object, "contentType", "application/x-tar");
  cleanup_free char *body = meta != NULL ? json_dumps (meta, JSON_COMPACT) : NULL;
  json_decref (meta);
  struct curl_slist *hdrs = curl_slist_append (NULL, "Content-Type: application/json; charset=UTF-8");
  struct curl_slist *h2 = hdrs != NULL ? curl_slist_append (hdrs, "X-Upload-Content-Type: application/x-tar") : NULL;
  if (w->object == NULL || w->what == NULL || w->buf == NULL || w->h == NULL || url == NULL || body == NULL
      || h2 == NULL)
    {
      curl_slist_free_all (hdrs);
      writer_free (w);
      return err_make (err, ENOMEM, "upload `%s`: out of memory", object);
    }

  gcs_req_t req = {.method = "POST",
                   .url = url,
                   .headers = hdrs,
                   .body = body,
                   .body_len = strlen (body),
                   .timeout_s = SMALL_REQUEST_TIMEOUT_S};
  gcs_resp_t resp = {0};
  int rc = do_with_retry (s, w->h, &req, &resp, w->what, "start upload", NULL, err);
  curl_slist_free_all (hdrs);
  if (rc == 0 && (resp.status < 200 || resp.status > 299))
    rc = fail_status (&resp, "start upload", w->what, err);
  if (rc == 0
      && (resp.location == NULL
          || (strncmp (resp.location, "https://", 8) != 0 && strncmp (resp.location, "http://", 7) != 0)))
    rc = err_make (err, EIO, "start upload `%s`: HTTP %ld without a usable Location header", w->what, resp.status);
  if (rc == 0)
    w->session = take_ptr (&resp.location);
  gcs_resp_clear (&resp);
  if (rc < 0)
    {
      writer_free (w);
      return -1;
    }
  *out = (snap_writer_t *) w;
  return 0;
}

/* The server has committed `committed` bytes: drop them from the buffer. */
static int
writer_advance (gcs_writer_t *w, uint64_t committed, err_t *err)
{
  if (committed < w->base || committed > w->base + w->len)
    return err_make (err, EIO,
                     "upload `%s`: the server reports %" PRIu64 " bytes committed, outside the %" PRIu64 "..%" PRIu64
                     " it can have; cannot resume",
                     w->what, committed, w->base, w->base + w->len);
  size_t done = (size_t) (committed - w->base);
  memmove (w->buf, w->buf + done, w->len - done);
  w->len -= done;
  w->base = committed;
  return 0;
}

/* After the final chunk was accepted: checks the object resource the server
 * returned (size and crc32c, when present) against what was written. */
static int
writer_check_resource (gcs_writer_t *w, const gcs_resp_t *resp, err_t *err)
{
  if (resp->body == NULL || resp->body_truncated)
    return 0;
  json_error_t jerr;
  json_t *root = json_loadb (resp->body, resp->body_len, 0, &jerr);
  if (root == NULL)
    return 0;
  int rc = 0;
  const char *size = json_string_value (json_object_get (root, "size"));
  const char *crc = json_string_value (json_object_get (root, "crc32c"));
  char want_size[32];
  snprintf (want_size, sizeof want_size, "%" PRIu64, w->base + w->len);
  char want_crc[9];
  gcs_crc32c_base64 (w->crc, want_crc);
  if (size != NULL && strcmp (size, want_size) != 0)
    rc = err_make (err, EBADMSG, "upload `%s`: the stored object has %.32s bytes, %s were written", w->what, size,
                   want_size);
  else if (crc != NULL && strcmp (crc, want_crc) != 0)
    rc = err_make (err, EBADMSG, "upload `%s`: the stored object's crc32c %.16s differs from the written %s", w->what,
                   crc, want_crc);
  json_decref (root);
  return rc;
}

/* Asks the server how much of the upload it has (PUT "bytes * / *" with no
 * body), within `retry`'s budget. 0 with *complete set when the object is
 * already final (then *resp holds its resource), else advanced to the
 * committed offset; -1 with *err. */
static int
writer_query (gcs_writer_t *w, gcs_retry_t *retry, gcs_resp_t *resp, bool *complete, err_t *err)
{
  struct curl_slist *hdrs = curl_slist_append (NULL, "Content-Range: bytes */*");
  if (hdrs == NULL)
    return err_make (err, ENOMEM, "upload `%s`: out of memory", w->what);
  gcs_req_t req = {.method = "PUT", .url = w->session, .headers = hdrs, .timeout_s = SMALL_REQUEST_TIMEOUT_S};
  int rc = -1;
  *complete = false;
  for (;;)
    {
      if (authed_do (w->store, w->h, &req, resp, err) < 0)
        break;
      if (resp->rc == CURLE_OK && (resp->status == 200 || resp->status == 201))
        {
          *complete = true;
          rc = 0;
          break;
        }
      if (resp->rc == CURLE_OK && resp->status == 308)
        {
          if (resp->range_bad)
            {
              err_make (err, EIO, "upload `%s`: the server sent a malformed Range header", w->what);
              break;
            }
          rc = writer_advance (w, resp->has_range ? resp->committed : 0, err);
          break;
        }
      if (resp->rc == CURLE_OK && (resp->status == 404 || resp->status == 410))
        {
          cleanup_free char *d = gcs_resp_describe (resp);
          err_make (err, EIO, "upload `%s`: the upload session is gone (%s)", w->what, d ? d : "?");
          break;
        }
      if (!gcs_resp_retryable (resp))
        {
          fail_status (resp, "query upload", w->what, err);
          break;
        }
      log_retry (w->what, "query upload", resp);
      if (gcs_retry_wait (retry) < 0)
        {
          cleanup_free char *d = gcs_resp_describe (resp);
          err_make (err, ETIMEDOUT, "upload `%s`: gave up after %.1f s of retries at offset %" PRIu64 "; last failure: %s",
                    w->what, gcs_retry_elapsed_s (retry), w->base, d ? d : "?");
          break;
        }
    }
  curl_slist_free_all (hdrs);
  return rc;
}

/* Sends the buffer: a full chunk (final false), or the rest and the total
 * (final true). Returns 0 once the server has committed more (final false)
 * or has finalised the object (final true); resumes from the committed
 * offset after failures until the retry budget runs out. */
static int
writer_send (gcs_writer_t *w, bool final, err_t *err)
{
  gcs_store_t *s = w->store;
  gcs_retry_t retry;
  gcs_retry_init (&retry, &s->net);
  gcs_resp_t resp = {0};
  int rc = -1;
  for (;;)
    {
      uint64_t total = w->base + w->len;
      char range[96], hash[32];
      if (w->len == 0 && final)
        snprintf (range, sizeof range, "Content-Range: bytes */%" PRIu64, total);
      else if (w->len == 0)
        {
          rc = 0;
          break;
        }
      else if (final)
        snprintf (range, sizeof range, "Content-Range: bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, w->base,
                  total - 1, total);
      else
        snprintf (range, sizeof range, "Content-Range: bytes %" PRIu64 "-%" PRIu64 "/*", w->base, total - 1);
      char b64[9];
      gcs_crc32c_base64 (w->crc, b64);
      snprintf (hash, sizeof hash, "X-Goog-Hash: crc32c=%s", b64);
      struct curl_slist *hdrs = curl_slist_append (NULL, range);
      struct curl_slist *h2 = hdrs != NULL ? curl_slist_append (hdrs, "Content-Type:") : NULL;
      struct curl_slist *h3 = h2 != NULL && final ? curl_slist_append (h2, hash) : h2;
      if (h3 == NULL)
        {
          curl_slist_free_all (hdrs);
          err_make (err, ENOMEM, "upload `%s`: out of memory", w->what);
          break;
        }
      /* Bounded as a whole too (a server trickling its answer would beat
       * the stall limit): 5 minutes plus 32 KiB/s for the body. */
      gcs_req_t req = {.method = "PUT",
                       .url = w->session,
                       .headers = hdrs,
                       .body = w->buf,
                       .body_len = w->len,
                       .timeout_s = CHUNK_TIMEOUT_BASE_S + (long) (w->len / (32 * 1024))};
      int dorc = authed_do (s, w->h, &req, &resp, err);
      curl_slist_free_all (hdrs);
      if (dorc < 0)
        break;

      bool ok = resp.rc == CURLE_OK;
      if (ok && (resp.status == 200 || resp.status == 201))
        {
          if (!final)
            {
              err_make (err, EIO, "upload `%s`: the server finalised the object before its last chunk", w->what);
              break;
            }
          rc = writer_check_resource (w, &resp, err);
          break;
        }
      if (ok && resp.status == 308)
        {
          if (resp.range_bad)
            {
              err_make (err, EIO, "upload `%s`: the server sent a malformed Range header", w->what);
              break;
            }
          uint64_t before = w->base;
          if (writer_advance (w, resp.has_range ? resp.committed : 0, err) < 0)
            break;
          if (w->base > before)
            {
              gcs_retry_reset (&retry);
              if (!final)
                {
                  rc = 0;
                  break;
                }
              continue; /* final: send what is left */
            }
          /* Nothing committed: as good as a failure, but nothing to query. */
          log_retry (w->what, "upload chunk", &resp);
          if (gcs_retry_wait (&retry) < 0)
            {
              err_make (err, ETIMEDOUT,
                        "upload `%s`: gave up after %.1f s of retries at offset %" PRIu64
                        "; the server keeps committing nothing (HTTP 308)",
                        w->what, gcs_retry_elapsed_s (&retry), w->base);
              break;
            }
          continue;
        }
      if (!gcs_resp_retryable (&resp))
        {
          fail_status (&resp, "upload", w->what, err);
          break;
        }
      log_retry (w->what, "upload chunk", &resp);
      if (gcs_retry_wait (&retry) < 0)
        {
          cleanup_free char *d = gcs_resp_describe (&resp);
          err_make (err, ETIMEDOUT, "upload `%s`: gave up after %.1f s of retries at offset %" PRIu64 "; last failure: %s",
                    w->what, gcs_retry_elapsed_s (&retry), w->base, d ? d : "?");
          break;
        }
      bool complete = false;
      uint64_t before = w->base;
      if (writer_query (w, &retry, &resp, &complete, err) < 0)
        break;
      if (complete)
        {
          if (!final)
            {
              err_make (err, EIO, "upload `%s`: the server finalised the object before its last chunk", w->what);
              break;
            }
          rc = writer_check_resource (w, &resp, err);
          break;
        }
      if (w->base > before)
        gcs_retry_reset (&retry);
      if (!final && w->base > before && w->len < s->chunk_size)
        {
          rc = 0; /* progress: the caller refills the buffer */
          break;
        }
    }
  gcs_resp_clear (&resp);
  return rc;
}

static int
gcs_writer_write (snap_writer_t *sw, const uint8_t *data, size_t len, err_t *err)
{
  gcs_writer_t *w = (gcs_writer_t *) sw;
  if (w->failed)
    return err_make (err, EIO, "upload `%s`: an earlier write failed", w->what);
  size_t chunk = w->store->chunk_size;
  while (len > 0)
    {
      size_t n = chunk - w->len < len ? chunk - w->len : len;
      memcpy (w->buf + w->len, data, n);
      w->crc = gcs_crc32c (w->crc, data, n);
      w->len += n;
      data += n;
      len -= n;
      if (w->len == chunk && writer_send (w, false, err) < 0)
        {
          w->failed = true;
          return -1;
        }
    }
  return 0;
}

static int
gcs_writer_commit (snap_writer_t *sw, err_t *err)
{
  gcs_writer_t *w = (gcs_writer_t *) sw;
  int rc;
  if (w->failed)
    rc = err_make (err, EIO, "upload `%s`: an earlier write failed; nothing committed", w->what);
  else
    rc = writer_send (w, true, err);
  if (rc < 0)
    writer_cancel (w);
  writer_free (w);
  return rc;
}

static void
gcs_writer_abort (snap_writer_t *sw)
{
  gcs_writer_t *w = (gcs_writer_t *) sw;
  if (w == NULL)
    return;
  writer_cancel (w);
  writer_free (w);
}

/* ---- reader -------------------------------------------------------------- */

/* libcurl pushes, snap_reader_t pulls: the transfer runs on a private multi
 * handle driven from gcs_reader_read. The write callback takes one piece
 * into `pend` when it is empty and pauses the transfer otherwise; reading
 * drains `pend` and unpauses. */
typedef struct gcs_reader_s
{
  gcs_store_t *store;
  char *what;
  char *url;
  CURL *h;
  CURLM *m;
  bool attached;        /* h is in m */
  struct curl_slist *hdrs;
  gcs_resp_t resp;
  uint8_t *pend;
  size_t pend_cap, pend_off, pend_len;
  bool paused;
  bool done;            /* the transfer has ended */
  CURLcode result;      /* how, when done */
  bool oversize;        /* the write callback was handed more than READ_PIECE_MAX */
  uint32_t crc;
  uint64_t got;
  bool verified;        /* the end was reached and checked */
} gcs_reader_t;

static size_t
reader_on_body (char *data, size_t size, size_t n, void *user)
{
  gcs_reader_t *r = user;
  size_t len = size * n;
  if (!r->resp.headers_done || r->resp.status != 200)
    return gcs_resp_body_append (&r->resp, data, len) < 0 ? 0 : len; /* an error body */
  if (r->pend_off < r->pend_len)
    {
      r->paused = true;
      return CURL_WRITEFUNC_PAUSE;
    }
  if (len > READ_PIECE_MAX)
    {
      r->oversize = true;
      return 0;
    }
  if (len > r->pend_cap)
    {
      uint8_t *nb = realloc (r->pend, len);
      if (nb == NULL)
        return 0;
      r->pend = nb;
      r->pend_cap = len;
    }
  memcpy (r->pend, data, len);
  r->pend_off = 0;
  r->pend_len = len;
  r->crc = gcs_crc32c (r->crc, (const uint8_t *) data, len);
  r->got += len;
  return len;
}

static void
reader_detach (gcs_reader_t *r)
{
  if (r->attached)
    curl_multi_remove_handle (r->m, r->h);
  r->attached = false;
  curl_slist_free_all (r->hdrs);
  r->hdrs = NULL;
}

static void
reader_free (gcs_reader_t *r)
{
  if (r == NULL)
    return;
  reader_detach (r);
  if (r->h != NULL)
    {
      curl_easy_setopt (r->h, CURLOPT_ERRORBUFFER, NULL);
      curl_easy_cleanup (r->h);
    }
  if (r->m != NULL)
    curl_multi_cleanup (r->m);
  gcs_resp_clear (&r->resp);
  free (r->pend);
  free (r->what);
  free (r->url);
  free (r);
}

/* Drives the transfer once: performs what is ready, then waits up to
 * `wait_ms` for the socket if nothing happened. -1 with *err on a curl
 * multi failure. */
static int
reader_pump (gcs_reader_t *r, int wait_ms, err_t *err)
{
  int running = 0;
  CURLMcode mc = curl_multi_perform (r->m, &running);
  if (mc != CURLM_OK)
    return err_make (err, EIO, "download `%s`: %s", r->what, curl_multi_strerror (mc));
  int left = 0;
  CURLMsg *msg;
  while ((msg = curl_multi_info_read (r->m, &left)) != NULL)
    if (msg->msg == CURLMSG_DONE && msg->easy_handle == r->h)
      {
        r->done = true;
        r->result = msg->data.result;
      }
  if (!r->done && r->pend_off >= r->pend_len && wait_ms > 0)
    {
      mc = curl_multi_poll (r->m, NULL, 0, wait_ms, NULL);
      if (mc != CURLM_OK)
        return err_make (err, EIO, "download `%s`: %s", r->what, curl_multi_strerror (mc));
    }
  return 0;
}

/* Starts the GET and drives it until the response's headers are in (and,
 * for anything but 200, until its end). 0 or -1 with *err (set-up only). */
static int
reader_start (gcs_reader_t *r, err_t *err)
{
  reader_detach (r);
  r->done = false;
  r->result = CURLE_OK;
  r->paused = false;
  r->pend_off = r->pend_len = 0;
  r->crc = 0;
  r->got = 0;
  gcs_req_t req = {.method = "GET", .url = r->url, .body_max = 16 * 1024};
  char *auth = NULL;
  if (gcs_auth_header (r->store->auth, &auth, err) < 0)
    return -1;
  req.auth_header = auth;
  int rc = gcs_http_setup (r->h, &r->store->net, &req, &r->resp, &r->hdrs, err);
  gcs_auth_header_free (auth); /* curl copied it into r->hdrs */
  if (rc < 0)
    return -1;
  curl_easy_setopt (r->h, CURLOPT_WRITEFUNCTION, reader_on_body);
  curl_easy_setopt (r->h, CURLOPT_WRITEDATA, r);
  CURLMcode mc = curl_multi_add_handle (r->m, r->h);
  if (mc != CURLM_OK)
    return err_make (err, EIO, "download `%s`: %s", r->what, curl_multi_strerror (mc));
  r->attached = true;
  while (!r->done && !(r->resp.headers_done && r->resp.status == 200))
    if (reader_pump (r, 1000, err) < 0)
      return -1;
  if (r->done && r->result != CURLE_OK)
    {
      r->resp.rc = r->result;
      r->resp.status = 0;
    }
  else
    r->resp.rc = CURLE_OK;
  return 0;
}

static int
gcs_reader_open (snap_store_t *store, const char *object, snap_reader_t **out, err_t *err)
{
  gcs_store_t *s = (gcs_store_t *) store;
  if (check_object_name (object, err) < 0)
    return -1;
  gcs_reader_t *r = calloc (1, sizeof *r);
  if (r == NULL)
    return err_make (err, ENOMEM, "download `%s`: out of memory", object);
  r->store = s;
  if (asprintf (&r->what, "gs://%s/%s", s->bucket, object) < 0)
    r->what = NULL;
  r->url = object_url (s, object, "?alt=media");
  r->h = curl_easy_init ();
  r->m = curl_multi_init ();
  if (r->what == NULL || r->url == NULL || r->h == NULL || r->m == NULL)
    {
      reader_free (r);
      return err_make (err, ENOMEM, "download `%s`: out of memory", object);
    }

  gcs_retry_t retry;
  gcs_retry_init (&retry, &s->net);
  bool reauthed = false;
  for (;;)
    {
      if (reader_start (r, err) < 0)
        goto fail;
      gcs_resp_t *resp = &r->resp;
      if (resp->rc == CURLE_OK && resp->status == 200)
        break;
      if (resp->rc == CURLE_OK && resp->status == 401 && s->auth != NULL && !reauthed)
        {
          reauthed = true;
          gcs_auth_invalidate (s->auth);
          continue;
        }
      if (resp->rc == CURLE_OK && resp->status == 404)
        {
          err_make (err, ENOENT, "no snapshot `%s` (HTTP 404)", r->what);
          goto fail;
        }
      if (!gcs_resp_retryable (resp))
        {
          fail_status (resp, "download", r->what, err);
          goto fail;
        }
      log_retry (r->what, "download", resp);
      if (gcs_retry_wait (&retry) < 0)
        {
          cleanup_free char *d = gcs_resp_describe (resp);
          err_make (err, ETIMEDOUT, "download `%s`: gave up after %.1f s of retries; last failure: %s", r->what,
                    gcs_retry_elapsed_s (&retry), d ? d : "?");
          goto fail;
        }
    }
  *out = (snap_reader_t *) r;
  return 0;

fail:
  reader_free (r);
  return -1;
}

static ssize_t
gcs_reader_read (snap_reader_t *sr, uint8_t *buf, size_t cap, err_t *err)
{
  gcs_reader_t *r = (gcs_reader_t *) sr;
  if (cap == 0)
    return 0;
  for (;;)
    {
      if (r->pend_off < r->pend_len)
        {
          size_t n = r->pend_len - r->pend_off < cap ? r->pend_len - r->pend_off : cap;
          memcpy (buf, r->pend + r->pend_off, n);
          r->pend_off += n;
          return (ssize_t) n;
        }
      if (r->done)
        break;
      if (r->paused)
        {
          r->paused = false;
          /* May call reader_on_body at once, refilling pend. */
          CURLcode cc = curl_easy_pause (r->h, CURLPAUSE_CONT);
          if (cc != CURLE_OK)
            return err_make (err, EIO, "download `%s`: resume the transfer: %s", r->what, curl_easy_strerror (cc));
          continue;
        }
      if (reader_pump (r, 1000, err) < 0)
        return -1;
    }
  if (r->result != CURLE_OK)
    {
      const char *detail = r->resp.errbuf[0] != '\0' ? r->resp.errbuf : curl_easy_strerror (r->result);
      if (r->oversize)
        detail = "a piece larger than the reader accepts";
      return err_make (err, EIO, "download `%s`: failed after %" PRIu64 " bytes: %s", r->what, r->got, detail);
    }
  if (!r->verified)
    {
      if (r->resp.crc_bad)
        return err_make (err, EBADMSG, "download `%s`: the server sent a malformed x-goog-hash crc32c", r->what);
      if (r->resp.has_crc && r->resp.crc != r->crc)
        {
          char want[9], got[9];
          gcs_crc32c_base64 (r->resp.crc, want);
          gcs_crc32c_base64 (r->crc, got);
          return err_make (err, EBADMSG, "download `%s`: crc32c mismatch: the object says %s, the %" PRIu64
                           " bytes received have %s",
                           r->what, want, r->got, got);
        }
      r->verified = true;
    }
  return 0;
}

static void
gcs_reader_close (snap_reader_t *sr)
{
  reader_free ((gcs_reader_t *) sr);
}

/* ---- metadata and deletion ----------------------------------------------- */

/* One small request on an object's resource (metadata, deletion), with
 * retries. Fills *resp (the caller clears it) and names the object in `what`
 * (freed by the caller) for messages. */
static int
object_request (gcs_store_t *s, const char *object, const char *method, const char *query, const char *verb,
                gcs_resp_t *resp, char **what, bool *retried, err_t *err)
{
  *what = NULL;
  if (check_object_name (object, err) < 0)
    return -1;
  cleanup_free char *url = object_url (s, object, query);
  if (asprintf (what, "gs://%s/%s", s->bucket, object) < 0)
    *what = NULL;
  CURL *h = curl_easy_init ();
  if (url == NULL || *what == NULL || h == NULL)
    {
      if (h != NULL)
        curl_easy_cleanup (h);
      return err_make (err, ENOMEM, "%s `%s`: out of memory", verb, object);
    }
  gcs_req_t req = {.method = method, .url = url, .timeout_s = SMALL_REQUEST_TIMEOUT_S};
  int rc = do_with_retry (s, h, &req, resp, *what, verb, retried, err);
  curl_easy_cleanup (h);
  return rc;
}

static int
gcs_exists (snap_store_t *store, const char *object, err_t *err)
{
  gcs_resp_t resp = {0};
  cleanup_free char *what = NULL;
  int rc = object_request ((gcs_store_t *) store, object, "GET", "?fields=name", "look up", &resp, &what, NULL, err);
  if (rc == 0)
    {
      if (resp.status == 200)
        rc = 1;
      else if (resp.status == 404)
        rc = 0;
      else
        rc = fail_status (&resp, "look up", what, err);
    }
  gcs_resp_clear (&resp);
  return rc;
}

static int
gcs_remove (snap_store_t *store, const char *object, err_t *err)
{
  gcs_resp_t resp = {0};
  cleanup_free char *what = NULL;
  bool retried = false;
  int rc = object_request ((gcs_store_t *) store, object, "DELETE", "", "delete", &resp, &what, &retried, err);
  if (rc == 0)
    {
      if (resp.status == 200 || resp.status == 204)
        rc = 0;
      else if (resp.status == 404 && retried)
        rc = 0; /* an attempt that failed on the way back may have deleted it */
      else if (resp.status == 404)
        rc = err_make (err, ENOENT, "delete `%s`: no such object", what);
      else
        rc = fail_status (&resp, "delete", what, err);
    }
  gcs_resp_clear (&resp);
  return rc;
}

/* ---- the store ----------------------------------------------------------- */

static void
gcs_destroy (snap_store_t *store)
{
  gcs_store_t *s = (gcs_store_t *) store;
  if (s == NULL)
    return;
  gcs_auth_free (s->auth);
  if (s->net_ready)
    gcs_net_fini (&s->net);
  free (s->base.prefix);
  free (s->bucket);
  free (s->bucket_esc);
  free (s->endpoint);
  free (s);
}

static const snap_store_ops_t gcs_ops = {
  .writer_open = gcs_writer_open,
  .writer_write = gcs_writer_write,
  .writer_commit = gcs_writer_commit,
  .writer_abort = gcs_writer_abort,
  .reader_open = gcs_reader_open,
  .reader_read = gcs_reader_read,
  .reader_close = gcs_reader_close,
  .remove = gcs_remove,
  .exists = gcs_exists,
  .destroy = gcs_destroy,
};

static const char *
env_or_null (const char *name)
{
  const char *v = getenv (name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

void
gcs_config_from_env (gcs_config_t *cfg)
{
  memset (cfg, 0, sizeof *cfg);
  cfg->bucket = env_or_null ("CLOUD_RUN_SANDBOX_GCS_BUCKET");
  cfg->prefix = env_or_null ("CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX");
  cfg->emulator_host = env_or_null ("STORAGE_EMULATOR_HOST");
  cfg->credentials_file = env_or_null ("GOOGLE_APPLICATION_CREDENTIALS");
  cfg->metadata_host = env_or_null ("GCE_METADATA_HOST");
}

static int
check_bucket (const char *bucket, err_t *err)
{
  if (bucket == NULL || bucket[0] == '\0')
    return err_make (err, EINVAL, "GCS bucket not set (CLOUD_RUN_SANDBOX_GCS_BUCKET)");
  size_t n = strlen (bucket);
  if (n < 3 || n > 222 || strspn (bucket, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != n)
    return err_make (err, EINVAL, "GCS bucket `%.64s`: not a bucket name (3 to 222 of a-z 0-9 - _ .)", bucket);
  return 0;
}

/* "http://host:port" from "host:port" or a URL, without trailing '/'. */
static char *
endpoint_url (const char *host)
{
  size_t n = strlen (host);
  while (n > 0 && host[n - 1] == '/')
    n--;
  char *url = NULL;
  if (asprintf (&url, "%s%.*s", strstr (host, "://") != NULL ? "" : "http://", (int) n, host) < 0)
    return NULL;
  return url;
}

int
gcs_store_new (const gcs_config_t *cfg, snap_store_t **out, err_t *err)
{
  if (check_bucket (cfg->bucket, err) < 0)
    return -1;
  size_t chunk = cfg->chunk_size != 0 ? cfg->chunk_size : GCS_DEFAULT_CHUNK_SIZE;
  if (chunk % GCS_CHUNK_QUANTUM != 0 || chunk > CHUNK_SIZE_MAX)
    return err_make (err, EINVAL, "GCS chunk size %zu: not a multiple of %u bytes (256 KiB) up to %u", chunk,
                     GCS_CHUNK_QUANTUM, CHUNK_SIZE_MAX);
  const char *endpoint = cfg->emulator_host != NULL ? cfg->emulator_host
                         : cfg->endpoint != NULL    ? cfg->endpoint
                                                    : GCS_DEFAULT_ENDPOINT;
  if (endpoint[0] == '\0')
    return err_make (err, EINVAL, "GCS endpoint is empty");
  pthread_once (&curl_once, curl_init);
  if (curl_init_rc != CURLE_OK)
    return err_make (err, EIO, "initialise libcurl: %s", curl_easy_strerror (curl_init_rc));

  gcs_store_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    return err_make (err, ENOMEM, "GCS store: out of memory");
  s->base.ops = &gcs_ops;
  s->base.kind = "gcs";
  s->base.prefix = strdup (cfg->prefix != NULL ? cfg->prefix : GCS_DEFAULT_PREFIX);
  s->bucket = strdup (cfg->bucket);
  s->bucket_esc = escape (cfg->bucket);
  s->endpoint = endpoint_url (endpoint);
  s->chunk_size = chunk;
  s->net.retry_budget_ms = cfg->retry_budget_ms != 0 ? cfg->retry_budget_ms : GCS_DEFAULT_RETRY_BUDGET_MS;
  s->net.backoff_initial_ms = cfg->backoff_initial_ms != 0 ? cfg->backoff_initial_ms : GCS_DEFAULT_BACKOFF_INITIAL_MS;
  s->net.backoff_max_ms = cfg->backoff_max_ms != 0 ? cfg->backoff_max_ms : GCS_DEFAULT_BACKOFF_MAX_MS;
  if (s->net.backoff_max_ms < s->net.backoff_initial_ms)
    s->net.backoff_max_ms = s->net.backoff_initial_ms;
  s->net.connect_timeout_s = cfg->connect_timeout_s > 0 ? cfg->connect_timeout_s : GCS_DEFAULT_CONNECT_TIMEOUT_S;
  s->net.stall_timeout_s = cfg->stall_timeout_s > 0 ? cfg->stall_timeout_s : GCS_DEFAULT_STALL_TIMEOUT_S;
  if (s->base.prefix == NULL || s->bucket == NULL || s->bucket_esc == NULL || s->endpoint == NULL)
    {
      gcs_destroy (&s->base);
      return err_make (err, ENOMEM, "GCS store: out of memory");
    }
  if (gcs_net_init (&s->net, err) < 0)
    {
      gcs_destroy (&s->base);
      return -1;
    }
  s->net_ready = true;

  int rc = 0;
  if (cfg->emulator_host != NULL)
    s->auth = NULL; /* the emulator convention: no credentials */
  else if (cfg->credentials_file != NULL)
    rc = gcs_auth_new_service_account (cfg->credentials_file, &s->net, &s->auth, err);
  else
    rc = gcs_auth_new_metadata (cfg->metadata_host, &s->net, &s->auth, err);
  if (rc < 0)
    {
      gcs_destroy (&s->base);
      return -1;
    }
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:s, s:s, s:s, s:I}", "bucket", s->bucket, "prefix", s->base.prefix, "endpoint",
                         s->endpoint, "credentials", gcs_auth_describe (s->auth), "chunk_size", (json_int_t) chunk),
              "GCS snapshot store ready");
  *out = &s->base;
  return 0;
}
