/* gcs upload: the store's writer, a resumable upload. Opening starts the
 * upload session; the writer buffers one chunk and PUTs it when full, the
 * rest with the total on commit. After a failure it asks the server how
 * much it has committed and resumes from there, within the retry budget;
 * the object appears under its name only when the final chunk is accepted,
 * and its size and crc32c are then checked against what was written.
 *
 * Not here: credentials and the retry loop of single requests (request.c),
 * HTTP mechanics (http.c), CRC32C (parse.c).
 *
 * Threading: a writer belongs to the thread that opened it (its own curl
 * handle and buffer); the store it points to is shared and only read.
 */
#include "gateway/store/gcs/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "common/cleanup.h"
#include "gateway/store/gcs/parse.h"

#define CANCEL_TIMEOUT_S 5       /* best-effort session cancel */
#define CHUNK_TIMEOUT_BASE_S 300 /* a chunk PUT: this plus its size at 32 KiB/s */

typedef struct gcs_writer_s
{
  gcs_store_t *store;
  char *what; /* "gs://bucket/object", for messages */
  char *object;
  CURL *h;
  char *session; /* the resumable session URI */
  uint8_t *buf;  /* one chunk: the bytes from offset `base` not yet committed */
  size_t len;
  uint64_t base; /* bytes the server has committed */
  uint32_t crc;  /* CRC32C of everything written */
  bool failed;
} gcs_writer_t;

/* How a step of writer_send ends, besides -1 with *err. */
enum
{
  SEND_OVER = 0,  /* the send is done */
  SEND_AGAIN = 1, /* send what is left of the buffer again */
};

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
  cleanup_err err_t err = ERR_INIT;
  gcs_authed_do (w->store, w->h, &req, &resp, &err); /* best effort: the session expires anyway */
  gcs_resp_clear (&resp);
}

/* ---- opening ------------------------------------------------------------- */

static bool
is_http_url (const char *s)
{
  return s != NULL && (strncmp (s, "https://", 8) == 0 || strncmp (s, "http://", 7) == 0);
}

/* Starts the resumable upload of w->object and keeps its session URI. */
static int
writer_start (gcs_writer_t *w, err_t *err)
{
  gcs_store_t *s = w->store;
  cleanup_free char *esc = gcs_escape (w->object);
  cleanup_free char *url = NULL;
  if (esc == NULL
      || asprintf (&url, "%s/upload/storage/v1/b/%s/o?uploadType=resumable&name=%s", s->endpoint, s->bucket_esc, esc)
             < 0)
    url = NULL;
  json_t *meta = json_pack ("{s:s, s:s}", "name", w->object, "contentType", "application/x-tar");
  cleanup_free char *body = meta != NULL ? json_dumps (meta, JSON_COMPACT) : NULL;
  json_decref (meta);
  struct curl_slist *hdrs = curl_slist_append (NULL, "Content-Type: application/json; charset=UTF-8");
  struct curl_slist *h2 = hdrs != NULL ? curl_slist_append (hdrs, "X-Upload-Content-Type: application/x-tar") : NULL;
  if (url == NULL || body == NULL || h2 == NULL)
    {
      curl_slist_free_all (hdrs);
      return err_make (err, ENOMEM, "upload `%s`: out of memory", w->object);
    }

  gcs_req_t req = {.method = "POST",
                   .url = url,
                   .headers = hdrs,
                   .body = body,
                   .body_len = strlen (body),
                   .timeout_s = SMALL_REQUEST_TIMEOUT_S};
  gcs_resp_t resp = {0};
  int rc = gcs_do_with_retry (s, w->h, &req, &resp, w->what, "start upload", NULL, err);
  curl_slist_free_all (hdrs);
  if (rc == 0 && (resp.status < 200 || resp.status > 299))
    rc = gcs_fail_status (&resp, "start upload", w->what, err);
  if (rc == 0 && !is_http_url (resp.location))
    rc = err_make (err, EIO, "start upload `%s`: HTTP %ld without a usable Location header", w->what, resp.status);
  if (rc == 0 && strncmp (resp.location, "http://", 7) == 0 && !s->net.plain_http_ok)
    rc = err_make (err, EPROTO,
                   "start upload `%s`: the upload session `%.200s` is plain HTTP: refused (the token "
                   "would travel unencrypted)",
                   w->what, resp.location);
  if (rc == 0)
    w->session = take_ptr (&resp.location);
  gcs_resp_clear (&resp);
  return rc;
}

static void
writer_free_scope (gcs_writer_t **w)
{
  writer_free (*w);
}

/* A writer freed when the scope ends, unless take_ptr handed it out. */
#define cleanup_writer __attribute__ ((cleanup (writer_free_scope)))

int
gcs_writer_open (snap_store_t *store, const char *object, snap_writer_t **out, err_t *err)
{
  gcs_store_t *s = (gcs_store_t *) store;
  if (gcs_check_object_name (object, err) < 0)
    return -1;
  cleanup_writer gcs_writer_t *w = calloc (1, sizeof *w);
  if (w == NULL)
    return err_make (err, ENOMEM, "upload `%s`: out of memory", object);
  w->store = s;
  w->object = strdup (object);
  w->what = gcs_object_what (s, object);
  w->buf = malloc (s->chunk_size);
  w->h = curl_easy_init ();
  if (w->object == NULL || w->what == NULL || w->buf == NULL || w->h == NULL)
    return err_make (err, ENOMEM, "upload `%s`: out of memory", object);
  if (writer_start (w, err) < 0)
    return -1;
  *out = take_ptr (&w);
  return 0;
}

/* ---- what the server has ------------------------------------------------- */

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

/* A 308 answer: the server has the bytes its Range header says (none
 * without one); the buffer is advanced to them. */
static int
writer_take_range (gcs_writer_t *w, const gcs_resp_t *resp, err_t *err)
{
  if (resp->range_bad)
    return err_make (err, EIO, "upload `%s`: the server sent a malformed Range header", w->what);
  return writer_advance (w, resp->has_range ? resp->committed : 0, err);
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

/* The server answered that the object is final (200 or 201): right only
 * after the last chunk, and then checked against what was written. */
static int
writer_finalised (gcs_writer_t *w, bool final, const gcs_resp_t *resp, err_t *err)
{
  if (!final)
    return err_make (err, EIO, "upload `%s`: the server finalised the object before its last chunk", w->what);
  return writer_check_resource (w, resp, err);
}

/* After a retryable failure of `step`: logs it and sleeps the next backoff.
 * -1 with *err (ETIMEDOUT) when the retry budget is spent. */
static int
writer_backoff (gcs_writer_t *w, const char *step, gcs_retry_t *retry, const gcs_resp_t *resp, err_t *err)
{
  gcs_log_retry (w->what, step, resp);
  if (gcs_retry_wait (retry) == 0)
    return 0;
  cleanup_free char *d = gcs_resp_describe (resp);
  return err_make (err, ETIMEDOUT,
                   "upload `%s`: gave up after %.1f s of retries at offset %" PRIu64 "; last failure: %s", w->what,
                   gcs_retry_elapsed_s (retry), w->base, d ? d : "?");
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
      if (gcs_authed_do (w->store, w->h, &req, resp, err) < 0)
        break;
      if (resp->rc == CURLE_OK && (resp->status == 200 || resp->status == 201))
        {
          *complete = true;
          rc = 0;
          break;
        }
      if (resp->rc == CURLE_OK && resp->status == 308)
        {
          rc = writer_take_range (w, resp, err);
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
          gcs_fail_status (resp, "query upload", w->what, err);
          break;
        }
      if (writer_backoff (w, "query upload", retry, resp, err) < 0)
        break;
    }
  curl_slist_free_all (hdrs);
  return rc;
}

/* ---- sending ------------------------------------------------------------- */

/* PUTs the buffer once (it is not empty unless `final`): the bytes from
 * w->base, with the total and the crc32c of the whole object when final.
 * 0 when performed (look at *resp), -1 with *err. */
static int
writer_put (gcs_writer_t *w, bool final, gcs_resp_t *resp, err_t *err)
{
  uint64_t total = w->base + w->len;
  char range[96], hash[32];
  if (w->len == 0)
    snprintf (range, sizeof range, "Content-Range: bytes */%" PRIu64, total);
  else if (final)
    snprintf (range, sizeof range, "Content-Range: bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, w->base, total - 1,
              total);
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
      return err_make (err, ENOMEM, "upload `%s`: out of memory", w->what);
    }
  /* Bounded as a whole too (a server trickling its answer would beat the
   * stall limit): 5 minutes plus 32 KiB/s for the body. */
  gcs_req_t req = {.method = "PUT",
                   .url = w->session,
                   .headers = hdrs,
                   .body = w->buf,
                   .body_len = w->len,
                   .timeout_s = CHUNK_TIMEOUT_BASE_S + (long) (w->len / (32 * 1024))};
  int rc = gcs_authed_do (w->store, w->h, &req, resp, err);
  curl_slist_free_all (hdrs);
  return rc;
}

/* A PUT answered 308: the server kept what its Range says. Progress resets
 * the retry budget and ends a chunk's send (the final send goes on with
 * what is left); no progress is a failure, with nothing to query. */
static int
writer_on_incomplete (gcs_writer_t *w, bool final, gcs_retry_t *retry, const gcs_resp_t *resp, err_t *err)
{
  uint64_t before = w->base;
  if (writer_take_range (w, resp, err) < 0)
    return -1;
  if (w->base > before)
    {
      gcs_retry_reset (retry);
      return final ? SEND_AGAIN : SEND_OVER;
    }
  gcs_log_retry (w->what, "upload chunk", resp);
  if (gcs_retry_wait (retry) < 0)
    return err_make (err, ETIMEDOUT,
                     "upload `%s`: gave up after %.1f s of retries at offset %" PRIu64
                     "; the server keeps committing nothing (HTTP 308)",
                     w->what, gcs_retry_elapsed_s (retry), w->base);
  return SEND_AGAIN;
}

/* A PUT failed retryably: waits, then asks the server what it has. A
 * chunk's send ends once the server has taken some of it (the caller
 * refills the buffer); otherwise what is left goes again. */
static int
writer_recover (gcs_writer_t *w, bool final, gcs_retry_t *retry, gcs_resp_t *resp, err_t *err)
{
  if (writer_backoff (w, "upload chunk", retry, resp, err) < 0)
    return -1;
  bool complete = false;
  uint64_t before = w->base;
  if (writer_query (w, retry, resp, &complete, err) < 0)
    return -1;
  if (complete)
    return writer_finalised (w, final, resp, err);
  if (w->base > before)
    gcs_retry_reset (retry);
  if (!final && w->base > before && w->len < w->store->chunk_size)
    return SEND_OVER; /* progress: the caller refills the buffer */
  return SEND_AGAIN;
}

/* One PUT of the buffer and what its answer calls for: SEND_OVER,
 * SEND_AGAIN or -1 with *err. */
static int
writer_send_step (gcs_writer_t *w, bool final, gcs_retry_t *retry, gcs_resp_t *resp, err_t *err)
{
  if (w->len == 0 && !final)
    return SEND_OVER;
  if (writer_put (w, final, resp, err) < 0)
    return -1;
  bool ok = resp->rc == CURLE_OK;
  if (ok && (resp->status == 200 || resp->status == 201))
    return writer_finalised (w, final, resp, err);
  if (ok && resp->status == 308)
    return writer_on_incomplete (w, final, retry, resp, err);
  if (!gcs_resp_retryable (resp))
    return gcs_fail_status (resp, "upload", w->what, err);
  return writer_recover (w, final, retry, resp, err);
}

/* Sends the buffer: a full chunk (final false), or the rest and the total
 * (final true). Returns 0 once the server has committed more (final false)
 * or has finalised the object (final true); resumes from the committed
 * offset after failures until the retry budget runs out. */
static int
writer_send (gcs_writer_t *w, bool final, err_t *err)
{
  gcs_retry_t retry;
  gcs_retry_init (&retry, &w->store->net);
  gcs_resp_t resp = {0};
  int step;
  do
    step = writer_send_step (w, final, &retry, &resp, err);
  while (step == SEND_AGAIN);
  gcs_resp_clear (&resp);
  return step < 0 ? -1 : 0;
}

/* ---- the writer's operations --------------------------------------------- */

int
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

int
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

void
gcs_writer_abort (snap_writer_t *sw)
{
  gcs_writer_t *w = (gcs_writer_t *) sw;
  if (w == NULL)
    return;
  writer_cancel (w);
  writer_free (w);
}
