/* gcs: the snapshot store on Google Cloud Storage, over the JSON API with
 * libcurl, OpenSSL and jansson (no Google SDK).
 *
 * Writers use resumable uploads: the object exists under its name only once
 * the final chunk is accepted, and a writer holds one chunk in memory, which
 * is what lets it resume after a failure from the offset the server has
 * committed. Readers stream the media and verify the object's CRC32C
 * (x-goog-hash) at the end. Transient failures (connection errors, 408, 429,
 * 5xx) are retried with exponential backoff and jitter within a time budget.
 *
 * Endpoint and credentials follow Google's client libraries: with
 * STORAGE_EMULATOR_HOST the store talks to that emulator without
 * credentials; otherwise to https://storage.googleapis.com with the
 * service-account key of GOOGLE_APPLICATION_CREDENTIALS, or else the GCE
 * metadata server (GCE_METADATA_HOST overrides its host).
 *
 * Threading: as store.h says — the store is shared by all threads (its
 * token cache and curl share handle are locked), a writer or reader belongs
 * to the thread that opened it. Call gcs_store_new before starting threads
 * that use curl elsewhere, or after curl_global_init (it calls it once).
 */
#ifndef SBX_GATEWAY_GCS_GCS_H
#define SBX_GATEWAY_GCS_GCS_H

#include <stddef.h>

#include "common/err.h"
#include "gateway/store/store.h"

#define GCS_DEFAULT_PREFIX "sandbox-snapshots/"
#define GCS_DEFAULT_ENDPOINT "https://storage.googleapis.com"
#define GCS_CHUNK_QUANTUM (256u * 1024u) /* chunk sizes are multiples of this */
#define GCS_DEFAULT_CHUNK_SIZE (8u * 1024u * 1024u)
#define GCS_DEFAULT_RETRY_BUDGET_MS 60000u
#define GCS_DEFAULT_BACKOFF_INITIAL_MS 250u
#define GCS_DEFAULT_BACKOFF_MAX_MS 16000u
#define GCS_DEFAULT_CONNECT_TIMEOUT_S 10
#define GCS_DEFAULT_STALL_TIMEOUT_S 60

/* Settings of a store. Strings are borrowed for the duration of
 * gcs_store_new (which copies them); NULL or 0 selects the default. */
typedef struct gcs_config_s
{
  const char *bucket;           /* required (CLOUD_RUN_SANDBOX_GCS_BUCKET) */
  const char *prefix;           /* object name prefix (CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX) */
  const char *emulator_host;    /* STORAGE_EMULATOR_HOST: "host:port" or a URL; talk to it without credentials */
  const char *endpoint;         /* storage endpoint URL when there is no emulator (default GCS_DEFAULT_ENDPOINT);
                                   credentials are used with it */
  const char *credentials_file; /* GOOGLE_APPLICATION_CREDENTIALS: service-account key JSON */
  const char *metadata_host;    /* GCE_METADATA_HOST: used when there is no credentials_file */
  size_t chunk_size;            /* upload chunk, a multiple of GCS_CHUNK_QUANTUM */
  unsigned retry_budget_ms;     /* time allowed for retries of one step, from its first failure */
  unsigned backoff_initial_ms;  /* first backoff; doubles up to backoff_max_ms, with jitter */
  unsigned backoff_max_ms;
  long connect_timeout_s; /* TCP + TLS connect */
  long stall_timeout_s;   /* a transfer below 1 byte/s for this long has failed */
} gcs_config_t;

/* Creates the store described by *cfg: kind "gcs", prefix cfg->prefix or
 * GCS_DEFAULT_PREFIX. Checks the settings and loads the service-account key
 * (if any) but makes no request. 0 ok with *out (destroy with
 * out->ops->destroy); -1 with *err: EINVAL for a bad setting or key file. */
int gcs_store_new (const gcs_config_t *cfg, snap_store_t **out, err_t *err);

/* Google credentials for other Google APIs (Artifact Registry's
 * `oauth2accesstoken` login): OAuth2 access tokens of the service account
 * of `credentials_file` (scope cloud-platform), else of the metadata server
 * at `metadata_host` (NULL: metadata.google.internal), cached like the
 * store's. Makes no request until a token is asked for. */
typedef struct gcs_tokens_s gcs_tokens_t;
int gcs_tokens_new (const char *credentials_file, const char *metadata_host, gcs_tokens_t **out, err_t *err);
/* A valid access token (free with gcs_tokens_put): -1 with *err when the
 * credentials could not give one. Any thread. */
int gcs_tokens_get (gcs_tokens_t *t, char **token, err_t *err);
void gcs_tokens_put (char *token);
void gcs_tokens_free (gcs_tokens_t *t);

#endif
