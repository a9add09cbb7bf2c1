/* gcs: the snapshot store on Google Cloud Storage (see gcs.h): its settings
 * from the environment, its creation (checked settings, the curl share
 * handle, the token source) and destruction, and the operations table that
 * joins the parts: the writer (upload.c: resumable uploads with one chunk
 * buffered), the reader (download.c: streamed, CRC32C-checked media) and
 * the object operations (objects.c: exists, remove).
 *
 * Not here: what those parts share (internal.h, request.c), HTTP mechanics
 * and the retry policy (http.c), tokens (auth.c), header parsing and CRC32C
 * (parse.c).
 *
 * Threading: curl's global initialisation runs once, under pthread_once.
 * The store's fields never change after gcs_store_new but for the cancel
 * flag (atomic); its token cache and curl share handle lock themselves. Each writer and reader has its own curl
 * handle and belongs to the thread that opened it.
 */
#include "gateway/store/gcs/gcs.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/store/gcs/internal.h"

#define CHUNK_SIZE_MAX (256u * 1024u * 1024u)

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void
curl_init (void)
{
  curl_init_rc = curl_global_init (CURL_GLOBAL_DEFAULT);
}

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

static void
gcs_cancel_all (snap_store_t *store)
{
  gcs_net_cancel (&((gcs_store_t *) store)->net);
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
    .stat = gcs_stat,
    .list_dirs = gcs_list_dirs,
    .cancel_all = gcs_cancel_all,
    .destroy = gcs_destroy,
};

/* ---- settings ------------------------------------------------------------ */

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

/* Timeouts and the retry budget from *cfg, defaults for what it leaves 0. */
static void
net_settings (gcs_net_t *net, const gcs_config_t *cfg)
{
  net->retry_budget_ms = cfg->retry_budget_ms != 0 ? cfg->retry_budget_ms : GCS_DEFAULT_RETRY_BUDGET_MS;
  net->backoff_initial_ms = cfg->backoff_initial_ms != 0 ? cfg->backoff_initial_ms : GCS_DEFAULT_BACKOFF_INITIAL_MS;
  net->backoff_max_ms = cfg->backoff_max_ms != 0 ? cfg->backoff_max_ms : GCS_DEFAULT_BACKOFF_MAX_MS;
  if (net->backoff_max_ms < net->backoff_initial_ms)
    net->backoff_max_ms = net->backoff_initial_ms;
  net->connect_timeout_s = cfg->connect_timeout_s > 0 ? cfg->connect_timeout_s : GCS_DEFAULT_CONNECT_TIMEOUT_S;
  net->stall_timeout_s = cfg->stall_timeout_s > 0 ? cfg->stall_timeout_s : GCS_DEFAULT_STALL_TIMEOUT_S;
}

/* The token source: none for an emulator, else the service-account key
 * file, else the metadata server. */
static int
store_credentials (gcs_store_t *s, const gcs_config_t *cfg, err_t *err)
{
  if (cfg->emulator_host != NULL)
    return 0; /* the emulator convention: no credentials (s->auth stays NULL) */
  if (cfg->credentials_file != NULL)
    return gcs_auth_new_service_account (cfg->credentials_file, &s->net, &s->auth, err);
  return gcs_auth_new_metadata (cfg->metadata_host, &s->net, &s->auth, err);
}

/* ---- the store ----------------------------------------------------------- */

static void
store_destroy_scope (gcs_store_t **s)
{
  if (*s != NULL)
    gcs_destroy (&(*s)->base);
}

/* A store destroyed when the scope ends, unless take_ptr handed it out. */
#define cleanup_store __attribute__ ((cleanup (store_destroy_scope)))

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

  cleanup_store gcs_store_t *s = calloc (1, sizeof *s);
  if (s == NULL)
    return err_make (err, ENOMEM, "GCS store: out of memory");
  s->base.ops = &gcs_ops;
  s->base.kind = "gcs";
  s->base.prefix = strdup (cfg->prefix != NULL ? cfg->prefix : GCS_DEFAULT_PREFIX);
  s->bucket = strdup (cfg->bucket);
  s->bucket_esc = gcs_escape (cfg->bucket);
  s->endpoint = endpoint_url (endpoint);
  s->chunk_size = chunk;
  net_settings (&s->net, cfg);
  s->net.plain_http_ok = s->endpoint != NULL && strncmp (s->endpoint, "http://", 7) == 0;
  if (s->base.prefix == NULL || s->bucket == NULL || s->bucket_esc == NULL || s->endpoint == NULL)
    return err_make (err, ENOMEM, "GCS store: out of memory");
  if (gcs_net_init (&s->net, err) < 0)
    return -1;
  s->net_ready = true;
  if (store_credentials (s, cfg, err) < 0)
    return -1;
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:s, s:s, s:s, s:I}", "bucket", s->bucket, "prefix", s->base.prefix, "endpoint",
                         s->endpoint, "credentials", gcs_auth_describe (s->auth), "chunk_size", (json_int_t) chunk),
              "GCS snapshot store ready");
  gcs_store_t *ready = take_ptr (&s);
  *out = &ready->base;
  return 0;
}
