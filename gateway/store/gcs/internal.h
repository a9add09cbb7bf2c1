/* gcs internal: what the parts of the GCS store share, private to
 * gateway/store/gcs. The store itself (gcs.c), its writer (upload.c), its
 * reader (download.c) and its object operations (objects.c) meet here: the
 * store's fields, the entry points of the operations table, and the request
 * helpers of request.c (credentials, retries, object URLs, errors).
 *
 * Threading: a gcs_store_t never changes after gcs_store_new (but for its
 * net's cancel flag, atomic) and may be used from any thread (its token cache and curl share handle lock themselves);
 * a CURL handle and a gcs_resp_t passed to the helpers belong to the
 * calling thread.
 */
#ifndef SBX_GATEWAY_GCS_INTERNAL_H
#define SBX_GATEWAY_GCS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <curl/curl.h>

#include "common/err.h"
#include "gateway/store/gcs/auth.h"
#include "gateway/store/gcs/http.h"
#include "gateway/store/store.h"

#define SMALL_REQUEST_TIMEOUT_S 60 /* metadata, delete, upload start, status query */

typedef struct gcs_store_s
{
  snap_store_t base; /* first: a snap_store_t * is a gcs_store_t * */
  char *bucket;
  char *bucket_esc; /* URL-escaped */
  char *endpoint;   /* no trailing '/' */
  size_t chunk_size;
  gcs_net_t net;
  bool net_ready;
  gcs_auth_t *auth; /* NULL: no credentials (emulator) */
} gcs_store_t;

/* ---- request helpers (request.c) ----------------------------------------- */

/* EINVAL unless `object` is a name GCS accepts (not empty, bounded, no line
 * breaks). */
int gcs_check_object_name (const char *object, err_t *err);

/* `s` URL-escaped, malloc'd (caller frees), or NULL. */
char *gcs_escape (const char *s);

/* "{endpoint}/storage/v1/b/{bucket}/o/{object}{suffix}" (caller frees), or
 * NULL. */
char *gcs_object_url (const gcs_store_t *s, const char *object, const char *suffix);

/* "gs://{bucket}/{object}", for messages (caller frees), or NULL. */
char *gcs_object_what (const gcs_store_t *s, const char *object);

/* One exchange with the store's credentials: when the API answers 401 with
 * a cached token, the token is dropped and the exchange tried once more.
 * 0 when performed (look at resp), -1 with *err when credentials or set-up
 * failed. */
int gcs_authed_do (gcs_store_t *s, CURL *h, gcs_req_t *req, gcs_resp_t *resp, err_t *err);

/* Logs a retryable failure of `step` on `what` (a warning). */
void gcs_log_retry (const char *what, const char *step, const gcs_resp_t *resp);

/* Performs `req` until it gets an answer that retrying cannot change. 0 with
 * that answer in *resp (any status: the caller decides), *retried (may be
 * NULL) set when an earlier attempt failed; -1 with *err when the retry
 * budget ran out (ETIMEDOUT, naming `what`, `step` and the last failure). */
int gcs_do_with_retry (gcs_store_t *s, CURL *h, gcs_req_t *req, gcs_resp_t *resp, const char *what, const char *step,
                       bool *retried, err_t *err);

/* The error for a final unexpected answer: EACCES for 401/403, ENOENT for
 * 404, else EIO. Returns -1. */
int gcs_fail_status (const gcs_resp_t *resp, const char *step, const char *what, err_t *err);

/* ---- the operations table's entries -------------------------------------- */

/* upload.c */
int gcs_writer_open (snap_store_t *store, const char *object, snap_writer_t **out, err_t *err);
int gcs_writer_write (snap_writer_t *sw, const uint8_t *data, size_t len, err_t *err);
int gcs_writer_commit (snap_writer_t *sw, err_t *err);
void gcs_writer_abort (snap_writer_t *sw);

/* download.c */
int gcs_reader_open (snap_store_t *store, const char *object, snap_reader_t **out, err_t *err);
ssize_t gcs_reader_read (snap_reader_t *sr, uint8_t *buf, size_t cap, err_t *err);
void gcs_reader_close (snap_reader_t *sr);

/* objects.c */
int gcs_exists (snap_store_t *store, const char *object, err_t *err);
int gcs_stat (snap_store_t *store, const char *object, snap_gen_t *out, err_t *err);
int gcs_list_dirs (snap_store_t *store, const char *dir, size_t max, int (*fn) (void *ctx, const char *name),
                   void *ctx, err_t *err);
int gcs_remove (snap_store_t *store, const char *object, err_t *err);

#endif
