/* gcs request: what every request of the store needs (see internal.h):
 * object names checked and escaped into URLs, the store's credentials with
 * one retry after a 401, the retry loop around an exchange, and the error
 * for a final unexpected answer.
 *
 * Not here: the HTTP exchange and the backoff policy themselves (http.c),
 * tokens (auth.c), what an answer means for a given operation (upload.c,
 * download.c, objects.c).
 *
 * Threading: no state of its own; the store is only read, the CURL handle
 * and the response belong to the caller's thread.
 */
#include "gateway/store/gcs/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/cleanup.h"
#include "common/log.h"

#define OBJECT_NAME_MAX 1024 /* GCS limit, in bytes */

/* ---- names --------------------------------------------------------------- */

int
gcs_check_object_name (const char *object, err_t *err)
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

/* curl's escaping, then copied so that free() is right. */
char *
gcs_escape (const char *s)
{
  char *e = curl_easy_escape (NULL, s, 0);
  if (e == NULL)
    return NULL;
  char *copy = strdup (e);
  curl_free (e);
  return copy;
}

char *
gcs_object_url (const gcs_store_t *s, const char *object, const char *suffix)
{
  cleanup_free char *esc = gcs_escape (object);
  char *url = NULL;
  if (esc == NULL || asprintf (&url, "%s/storage/v1/b/%s/o/%s%s", s->endpoint, s->bucket_esc, esc, suffix) < 0)
    return NULL;
  return url;
}

char *
gcs_object_what (const gcs_store_t *s, const char *object)
{
  char *what = NULL;
  if (asprintf (&what, "gs://%s/%s", s->bucket, object) < 0)
    return NULL;
  return what;
}

/* ---- exchanges ----------------------------------------------------------- */

/* errno for a final (non-retryable) HTTP status. */
static int
status_errno (long status)
{
  switch (status)
    {
    case 401:
    case 403: return EACCES;
    case 404: return ENOENT;
    default: return EIO;
    }
}

int
gcs_authed_do (gcs_store_t *s, CURL *h, gcs_req_t *req, gcs_resp_t *resp, err_t *err)
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

void
gcs_log_retry (const char *what, const char *step, const gcs_resp_t *resp)
{
  cleanup_free char *d = gcs_resp_describe (resp);
  log_fields (SEV_WARNING, json_pack ("{s:s, s:s, s:s}", "object", what, "step", step, "failure", d ? d : "?"),
              "GCS request failed; retrying");
}

int
gcs_do_with_retry (gcs_store_t *s, CURL *h, gcs_req_t *req, gcs_resp_t *resp, const char *what, const char *step,
                   bool *retried, err_t *err)
{
  gcs_retry_t retry;
  gcs_retry_init (&retry, &s->net);
  if (retried != NULL)
    *retried = false;
  for (;;)
    {
      if (gcs_authed_do (s, h, req, resp, err) < 0)
        return -1;
      if (!gcs_resp_retryable (resp))
        return 0;
      if (retried != NULL)
        *retried = true;
      gcs_log_retry (what, step, resp);
      if (gcs_retry_wait (&retry) < 0)
        {
          cleanup_free char *d = gcs_resp_describe (resp);
          return err_make (err, ETIMEDOUT, "%s `%s`: gave up after %.1f s of retries; last failure: %s", step, what,
                           gcs_retry_elapsed_s (&retry), d ? d : "?");
        }
    }
}

int
gcs_fail_status (const gcs_resp_t *resp, const char *step, const char *what, err_t *err)
{
  cleanup_free char *d = gcs_resp_describe (resp);
  int status = resp->rc != CURLE_OK ? EIO : status_errno (resp->status);
  return err_make (err, status, "%s `%s`: %s", step, what, d ? d : "?");
}
