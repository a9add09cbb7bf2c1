/* gcs tokens: Google access tokens for APIs beside the store (see gcs.h),
 * over the store's own token sources (auth.c) and network settings. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "common/cleanup.h"
#include "gateway/store/gcs/auth.h"
#include "gateway/store/gcs/gcs.h"

#define TOKENS_SCOPE "https://www.googleapis.com/auth/cloud-platform"
#define BEARER "Authorization: Bearer "

struct gcs_tokens_s
{
  gcs_net_t net;
  bool net_ready;
  gcs_auth_t *auth;
};

void
gcs_tokens_free (gcs_tokens_t *t)
{
  if (t == NULL)
    return;
  gcs_auth_free (t->auth);
  if (t->net_ready)
    gcs_net_fini (&t->net);
  free (t);
}

int
gcs_tokens_new (const char *credentials_file, const char *metadata_host, gcs_tokens_t **out, err_t *err)
{
  gcs_tokens_t *t = calloc (1, sizeof *t);
  if (t == NULL)
    return err_make (err, ENOMEM, "out of memory");
  t->net.retry_budget_ms = 20000;
  t->net.backoff_initial_ms = GCS_DEFAULT_BACKOFF_INITIAL_MS;
  t->net.backoff_max_ms = GCS_DEFAULT_BACKOFF_MAX_MS;
  t->net.connect_timeout_s = GCS_DEFAULT_CONNECT_TIMEOUT_S;
  t->net.stall_timeout_s = GCS_DEFAULT_STALL_TIMEOUT_S;
  int rc = gcs_net_init (&t->net, err);
  t->net_ready = rc == 0;
  if (rc == 0)
    rc = credentials_file != NULL ? gcs_auth_new_service_account (credentials_file, &t->net, &t->auth, err)
                                  : gcs_auth_new_metadata (metadata_host, &t->net, &t->auth, err);
  if (rc < 0)
    {
      gcs_tokens_free (t);
      return -1;
    }
  gcs_auth_set_scope (t->auth, TOKENS_SCOPE);
  *out = t;
  return 0;
}

int
gcs_tokens_get (gcs_tokens_t *t, char **token, err_t *err)
{
  char *header = NULL;
  if (gcs_auth_header (t->auth, &header, err) < 0)
    return -1;
  int rc = 0;
  if (header == NULL || strncmp (header, BEARER, strlen (BEARER)) != 0)
    rc = err_make (err, EIO, "Google credentials gave no bearer token");
  else if ((*token = strdup (header + strlen (BEARER))) == NULL)
    rc = err_make (err, ENOMEM, "out of memory");
  gcs_auth_header_free (header);
  return rc;
}

void
gcs_tokens_put (char *token)
{
  if (token != NULL)
    OPENSSL_clear_free (token, strlen (token));
}
