/* gcs download: the store's reader, a streamed GET of an object's media.
 * Opening retries until the response's headers say 200 (or the answer is
 * final: 404 is ENOENT); reading hands the body on as it arrives, and at
 * its end checks the bytes received against the object's CRC32C
 * (x-goog-hash). A transfer that breaks after the headers is an error, not
 * retried: the caller has already taken part of the stream.
 *
 * Not here: credentials and the error for a final answer (request.c), HTTP
 * set-up and header parsing (http.c, parse.c).
 *
 * Threading: a reader belongs to the thread that opened it (its own curl
 * easy and multi handles); the store it points to is shared and only read.
 */
#include "gateway/store/gcs/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/cleanup.h"
#include "gateway/store/gcs/parse.h"

#define READ_PIECE_MAX (1024u * 1024u) /* bigger write-callback pieces are refused */

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
  bool attached; /* h is in m */
  struct curl_slist *hdrs;
  gcs_resp_t resp;
  uint8_t *pend;
  size_t pend_cap, pend_off, pend_len;
  bool paused;
  bool done;       /* the transfer has ended */
  CURLcode result; /* how, when done */
  bool oversize;   /* the write callback was handed more than READ_PIECE_MAX */
  uint32_t crc;
  uint64_t got;
  bool verified; /* the end was reached and checked */
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

/* ---- opening ------------------------------------------------------------- */

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

/* Starts the GET until it is answered 200, with one fresh token after a
 * 401 and retries of what may pass. 0, or -1 with *err: ENOENT for 404,
 * ETIMEDOUT when the retry budget ran out. */
static int
reader_connect (gcs_reader_t *r, err_t *err)
{
  gcs_store_t *s = r->store;
  gcs_retry_t retry;
  gcs_retry_init (&retry, &s->net);
  bool reauthed = false;
  for (;;)
    {
      if (reader_start (r, err) < 0)
        return -1;
      gcs_resp_t *resp = &r->resp;
      if (resp->rc == CURLE_OK && resp->status == 200)
        return 0;
      if (resp->rc == CURLE_OK && resp->status == 401 && s->auth != NULL && !reauthed)
        {
          reauthed = true;
          gcs_auth_invalidate (s->auth);
          continue;
        }
      if (resp->rc == CURLE_OK && resp->status == 404)
        return err_make (err, ENOENT, "no snapshot `%s` (HTTP 404)", r->what);
      if (!gcs_resp_retryable (resp))
        return gcs_fail_status (resp, "download", r->what, err);
      gcs_log_retry (r->what, "download", resp);
      if (gcs_retry_wait (&retry) < 0)
        {
          cleanup_free char *d = gcs_resp_describe (resp);
          return err_make (err, ETIMEDOUT, "download `%s`: gave up after %.1f s of retries; last failure: %s",
                           r->what, gcs_retry_elapsed_s (&retry), d ? d : "?");
        }
    }
}

static void
reader_free_scope (gcs_reader_t **r)
{
  reader_free (*r);
}

/* A reader freed when the scope ends, unless take_ptr handed it out. */
#define cleanup_reader __attribute__ ((cleanup (reader_free_scope)))

int
gcs_reader_open (snap_store_t *store, const char *object, snap_reader_t **out, err_t *err)
{
  gcs_store_t *s = (gcs_store_t *) store;
  if (gcs_check_object_name (object, err) < 0)
    return -1;
  cleanup_reader gcs_reader_t *r = calloc (1, sizeof *r);
  if (r == NULL)
    return err_make (err, ENOMEM, "download `%s`: out of memory", object);
  r->store = s;
  r->what = gcs_object_what (s, object);
  r->url = gcs_object_url (s, object, "?alt=media");
  r->h = curl_easy_init ();
  r->m = curl_multi_init ();
  if (r->what == NULL || r->url == NULL || r->h == NULL || r->m == NULL)
    return err_make (err, ENOMEM, "download `%s`: out of memory", object);
  if (reader_connect (r, err) < 0)
    return -1;
  *out = take_ptr (&r);
  return 0;
}

/* ---- reading ------------------------------------------------------------- */

/* The transfer has ended: an error if it failed, else the CRC32C check
 * (once). 0 for the end of the object, -1 with *err (EBADMSG on a
 * mismatch). */
static int
reader_finish (gcs_reader_t *r, err_t *err)
{
  if (r->result != CURLE_OK)
    {
      const char *detail = r->resp.errbuf[0] != '\0' ? r->resp.errbuf : curl_easy_strerror (r->result);
      if (r->oversize)
        detail = "a piece larger than the reader accepts";
      return err_make (err, EIO, "download `%s`: failed after %" PRIu64 " bytes: %s", r->what, r->got, detail);
    }
  if (r->verified)
    return 0;
  if (r->resp.crc_bad)
    return err_make (err, EBADMSG, "download `%s`: the server sent a malformed x-goog-hash crc32c", r->what);
  if (r->resp.has_crc && r->resp.crc != r->crc)
    {
      char want[9], got[9];
      gcs_crc32c_base64 (r->resp.crc, want);
      gcs_crc32c_base64 (r->crc, got);
      return err_make (err, EBADMSG,
                       "download `%s`: crc32c mismatch: the object says %s, the %" PRIu64 " bytes received have %s",
                       r->what, want, r->got, got);
    }
  r->verified = true;
  return 0;
}

ssize_t
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
        return reader_finish (r, err);
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
}

void
gcs_reader_close (snap_reader_t *sr)
{
  reader_free ((gcs_reader_t *) sr);
}
