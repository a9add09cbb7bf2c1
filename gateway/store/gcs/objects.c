/* gcs objects: the store's operations on a whole object — whether it exists
 * and which generation (its metadata) and its deletion — over one shared request helper.
 *
 * Not here: the contents of objects (upload.c, download.c), credentials and
 * retries (request.c).
 *
 * Threading: any thread; each call makes and frees its own curl handle.
 */
#include "gateway/store/gcs/internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/cleanup.h"

/* One small request on an object's resource (metadata, deletion), with
 * retries. Fills *resp (the caller clears it) and names the object in `what`
 * (freed by the caller) for messages. */
static int
object_request (gcs_store_t *s, const char *object, const char *method, const char *query, const char *verb,
                gcs_resp_t *resp, char **what, bool *retried, err_t *err)
{
  *what = NULL;
  if (gcs_check_object_name (object, err) < 0)
    return -1;
  cleanup_free char *url = gcs_object_url (s, object, query);
  *what = gcs_object_what (s, object);
  CURL *h = curl_easy_init ();
  if (url == NULL || *what == NULL || h == NULL)
    {
      if (h != NULL)
        curl_easy_cleanup (h);
      return err_make (err, ENOMEM, "%s `%s`: out of memory", verb, object);
    }
  gcs_req_t req = {.method = method, .url = url, .timeout_s = SMALL_REQUEST_TIMEOUT_S};
  int rc = gcs_do_with_retry (s, h, &req, resp, *what, verb, retried, err);
  curl_easy_cleanup (h);
  return rc;
}

int
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
        rc = gcs_fail_status (&resp, "look up", what, err);
    }
  gcs_resp_clear (&resp);
  return rc;
}

/* An RFC 3339 UTC time ("2026-12-01T21:55:03.123Z") as Unix ms; 0 when it
 * does not parse. */
static int64_t
rfc3339_ms (const char *t)
{
  struct tm tm = {0};
  int n = 0;
  if (t == NULL
      || sscanf (t, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                 &tm.tm_sec, &n)
             != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  int64_t ms = (int64_t) timegm (&tm) * 1000;
  if (t[n] == '.')
    {
      int64_t scale = 100;
      for (const char *p = t + n + 1; *p >= '0' && *p <= '9'; p++, scale /= 10)
        ms += (*p - '0') * scale;
    }
  return ms;
}

int
gcs_stat (snap_store_t *store, const char *object, snap_gen_t *out, err_t *err)
{
  memset (out, 0, sizeof *out);
  gcs_resp_t resp = {0};
  cleanup_free char *what = NULL;
  int rc = object_request ((gcs_store_t *) store, object, "GET", "?fields=generation,updated", "look up", &resp,
                           &what, NULL, err);
  if (rc == 0)
    {
      if (resp.status == 404)
        rc = 0;
      else if (resp.status != 200)
        rc = gcs_fail_status (&resp, "look up", what, err);
      else
        {
          json_t *j = resp.body != NULL ? json_loads (resp.body, 0, NULL) : NULL;
          const char *gen = json_string_value (json_object_get (j, "generation"));
          if (gen == NULL || strlen (gen) >= sizeof out->gen)
            rc = err_make (err, EPROTO, "look up `%s`: the answer has no generation", what);
          else
            {
              snprintf (out->gen, sizeof out->gen, "%s", gen);
              out->mtime_ms = rfc3339_ms (json_string_value (json_object_get (j, "updated")));
              rc = 1;
            }
          json_decref (j);
        }
    }
  gcs_resp_clear (&resp);
  return rc;
}

int
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
        rc = gcs_fail_status (&resp, "delete", what, err);
    }
  gcs_resp_clear (&resp);
  return rc;
}
