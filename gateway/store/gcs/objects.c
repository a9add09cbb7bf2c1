/* gcs objects: the store's operations on a whole object — whether it exists
 * and which generation (its metadata) and its deletion — over one shared
 * request helper; and the listing of the "directories" under a prefix.
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
#include <stdlib.h>
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

/* Most pages one listing reads (each up to 1000 names). */
#define LIST_MAX_PAGES 64

/* One page of the listing of `dir`: its "prefixes" to fn, the next page's
 * token into *next (freed by the caller; NULL on the last page). */
static int
list_page (gcs_store_t *s, const char *dir, const char *token, size_t max, size_t *n,
           int (*fn) (void *ctx, const char *name), void *ctx, char **next, err_t *err)
{
  *next = NULL;
  cleanup_free char *esc = gcs_escape (dir), *tok = token != NULL ? gcs_escape (token) : NULL;
  cleanup_free char *url = NULL, *what = gcs_object_what (s, dir);
  if (esc == NULL || what == NULL || (token != NULL && tok == NULL)
      || asprintf (&url, "%s/storage/v1/b/%s/o?prefix=%s&delimiter=%%2F&fields=prefixes,nextPageToken%s%s",
                   s->endpoint, s->bucket_esc, esc, tok != NULL ? "&pageToken=" : "", tok != NULL ? tok : "")
             < 0)
    return err_make (err, ENOMEM, "list `%s`: out of memory", dir);
  CURL *h = curl_easy_init ();
  if (h == NULL)
    return err_make (err, ENOMEM, "list `%s`: out of memory", dir);
  gcs_req_t req = {.method = "GET", .url = url, .timeout_s = SMALL_REQUEST_TIMEOUT_S};
  gcs_resp_t resp = {0};
  int rc = gcs_do_with_retry (s, h, &req, &resp, what, "list", NULL, err);
  curl_easy_cleanup (h);
  if (rc == 0 && resp.status != 200)
    rc = gcs_fail_status (&resp, "list", what, err);
  json_t *j = rc == 0 && resp.body != NULL ? json_loads (resp.body, 0, NULL) : NULL;
  if (rc == 0 && !json_is_object (j))
    rc = err_make (err, EPROTO, "list `%s`: the answer is not a JSON object", what);
  json_t *prefixes = json_object_get (j, "prefixes");
  size_t len = strlen (dir);
  for (size_t i = 0; rc == 0 && i < json_array_size (prefixes); i++)
    {
      const char *p = json_string_value (json_array_get (prefixes, i));
      size_t pl = p != NULL ? strlen (p) : 0;
      if (pl < len + 2 || strncmp (p, dir, len) != 0 || p[pl - 1] != '/')
        continue;
      cleanup_free char *name = strndup (p + len, pl - len - 1);
      if (name == NULL)
        rc = err_make (err, ENOMEM, "list `%s`: out of memory", what);
      else
        rc = ++*n > max ? err_make (err, E2BIG, "list `%s`: more than %zu entries", what, max) : fn (ctx, name);
    }
  const char *nt = json_string_value (json_object_get (j, "nextPageToken"));
  if (rc == 0 && nt != NULL && nt[0] != '\0' && (*next = strdup (nt)) == NULL)
    rc = err_make (err, ENOMEM, "list `%s`: out of memory", what);
  json_decref (j);
  gcs_resp_clear (&resp);
  return rc;
}

int
gcs_list_dirs (snap_store_t *store, const char *dir, size_t max, int (*fn) (void *ctx, const char *name), void *ctx,
               err_t *err)
{
  size_t n = 0;
  char *token = NULL;
  for (int page = 0; page < LIST_MAX_PAGES; page++)
    {
      char *next = NULL;
      int rc = list_page ((gcs_store_t *) store, dir, token, max, &n, fn, ctx, &next, err);
      free (token);
      token = next;
      if (rc < 0 || token == NULL)
        {
          free (token);
          return rc;
        }
    }
  free (token);
  return err_make (err, E2BIG, "list `%s`: more than %d pages", dir, LIST_MAX_PAGES);
}
