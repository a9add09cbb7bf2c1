/* gcs auth: OAuth2 access tokens for the storage API, from a service-account
 * key file (a JWT signed RS256 with OpenSSL, exchanged at the key's
 * token_uri) or from the GCE metadata server, cached until 60 s before they
 * expire. Internal to gateway/store/gcs. No key material or token is ever logged
 * or put into an error message; copies are cleansed before they are freed.
 *
 * Thread safety: a gcs_auth_t is shared by all threads of its store; the
 * token cache is guarded by a mutex held while a token is fetched, so
 * concurrent callers wait for one fetch instead of each making their own.
 */
#ifndef SBX_GATEWAY_GCS_AUTH_H
#define SBX_GATEWAY_GCS_AUTH_H

#include "common/err.h"
#include "gateway/store/gcs/http.h"

typedef struct gcs_auth_s gcs_auth_t;

/* The OAuth scope requested for service-account tokens. */
#define GCS_AUTH_SCOPE "https://www.googleapis.com/auth/devstorage.read_write"

/* Token source from the service-account key JSON at `key_file` (fields
 * client_email, private_key, token_uri; type "service_account"). `net` is
 * borrowed and must outlive the result. 0 ok with *out (free with
 * gcs_auth_free), -1 with *err (EINVAL for a bad key file, ENOENT/EACCES
 * when it cannot be read). */
int gcs_auth_new_service_account (const char *key_file, const gcs_net_t *net, gcs_auth_t **out, err_t *err);

/* Token source from the metadata server at `host` ("host[:port]", or a URL
 * "http://host:port"; NULL: metadata.google.internal), for the default
 * service account. `net` is borrowed. 0 ok, -1 with *err. */
int gcs_auth_new_metadata (const char *host, const gcs_net_t *net, gcs_auth_t **out, err_t *err);

/* The request header "Authorization: Bearer <token>" with a valid token,
 * fetched when the cache has none. *out is owned by the caller, to be freed
 * with gcs_auth_header_free. With `auth` NULL (no credentials: an emulator)
 * sets *out to NULL and succeeds. -1 with *err: EACCES when the token
 * source refused the credentials, ETIMEDOUT/EIO when it could not be
 * reached within the retry budget. */
int gcs_auth_header (gcs_auth_t *auth, char **out, err_t *err);

/* Cleanses and frees a header from gcs_auth_header (NULL is fine). */
void gcs_auth_header_free (char *header);

/* Drops the cached token (after the storage API answered 401 with it). */
void gcs_auth_invalidate (gcs_auth_t *auth);

/* What the credentials are, for messages: "service account `x@y`" or
 * "metadata server `host`". The string is owned by `auth`. */
const char *gcs_auth_describe (const gcs_auth_t *auth);

/* The scope a service account's tokens are asked for (a static string;
 * GCS_AUTH_SCOPE until set). Before the first token. */
void gcs_auth_set_scope (gcs_auth_t *auth, const char *scope);

void gcs_auth_free (gcs_auth_t *auth);

#endif
