/* gcs auth: service-account JWT and metadata-server tokens with a cache (see
 * auth.h). The cache (token, expiry) is the only mutable state, guarded by
 * auth->mu; the key and the URLs never change after creation. */
#include "gateway/store/gcs/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/store/gcs/parse.h"

#define KEY_FILE_MAX (64 * 1024)
#define TOKEN_MAX 4096
#define TOKEN_EARLY_MS 60000u /* refresh this long before expiry */
#define TOKEN_REQUEST_TIMEOUT_S 30
#define DEFAULT_TOKEN_URI "https://oauth2.googleapis.com/token"
#define DEFAULT_METADATA_HOST "metadata.google.internal"
#define METADATA_TOKEN_PATH "/computeMetadata/v1/instance/service-accounts/default/token"

typedef enum auth_kind_e
{
  AUTH_SERVICE_ACCOUNT,
  AUTH_METADATA,
} auth_kind_t;

struct gcs_auth_s
{
  auth_kind_t kind;
  const gcs_net_t *net;
  char *describe; /* for messages */
  /* Service account. */
  char *client_email;
  char *token_uri;
  char *key_id; /* private_key_id, sent as the JWT "kid"; may be NULL */
  EVP_PKEY *key;
  /* Metadata server. */
  char *metadata_url;
  const char *scope; /* of a service account's tokens: GCS_AUTH_SCOPE unless set */
  /* The cache. */
  pthread_mutex_t mu;
  char *token;         /* NULL when none */
  uint64_t expires_ms; /* monotonic */
};

static void
free_secret (char *s)
{
  if (s != NULL)
    OPENSSL_clear_free (s, strlen (s));
}

void
gcs_auth_header_free (char *header)
{
  free_secret (header);
}

void
gcs_auth_free (gcs_auth_t *auth)
{
  if (auth == NULL)
    return;
  free (auth->describe);
  free (auth->client_email);
  free (auth->token_uri);
  free (auth->key_id);
  EVP_PKEY_free (auth->key);
  free (auth->metadata_url);
  free_secret (auth->token);
  pthread_mutex_destroy (&auth->mu);
  free (auth);
}

const char *
gcs_auth_describe (const gcs_auth_t *auth)
{
  return auth != NULL ? auth->describe : "no credentials";
}

static gcs_auth_t *
auth_alloc (auth_kind_t kind, const gcs_net_t *net)
{
  gcs_auth_t *a = calloc (1, sizeof *a);
  if (a == NULL)
    return NULL;
  a->kind = kind;
  a->net = net;
  pthread_mutex_init (&a->mu, NULL);
  return a;
}

/* ---- service accounts ---------------------------------------------------- */

/* Reads a small file whole; the buffer is NUL-terminated and must be
 * cleansed by the caller (it holds a private key). */
static int
read_key_file (const char *path, char **out, size_t *len, err_t *err)
{
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return err_make_sys (err, errno, "open service-account key file `%s`", path);
  struct stat st;
  if (fstat (fd, &st) < 0)
    return err_make_sys (err, errno, "stat service-account key file `%s`", path);
  if (!S_ISREG (st.st_mode) || st.st_size > KEY_FILE_MAX)
    return err_make (err, EINVAL, "service-account key file `%s`: not a regular file of at most %d bytes", path,
                     KEY_FILE_MAX);
  size_t cap = (size_t) st.st_size + 1;
  char *buf = malloc (cap);
  if (buf == NULL)
    return err_make (err, ENOMEM, "read service-account key file `%s`: out of memory", path);
  size_t got = 0;
  while (got + 1 < cap)
    {
      ssize_t n = TEMP_FAILURE_RETRY (read (fd, buf + got, cap - 1 - got));
      if (n < 0)
        {
          int e = errno;
          OPENSSL_clear_free (buf, cap);
          return err_make_sys (err, e, "read service-account key file `%s`", path);
        }
      if (n == 0)
        break;
      got += (size_t) n;
    }
  buf[got] = '\0';
  *out = buf;
  *len = got;
  return 0;
}

static const char *
json_str (json_t *obj, const char *name)
{
  return json_string_value (json_object_get (obj, name));
}

/* The key file parsed as a JSON object; its text is cleansed at once. */
static int
load_key_json (const char *key_file, json_t **out, err_t *err)
{
  char *text = NULL;
  size_t text_len = 0;
  if (read_key_file (key_file, &text, &text_len, err) < 0)
    return -1;
  json_error_t jerr;
  json_t *root = json_loadb (text, text_len, 0, &jerr);
  OPENSSL_clear_free (text, text_len + 1);
  if (root == NULL || !json_is_object (root))
    {
      json_decref (root);
      /* jerr.text describes the syntax only; it never quotes the key. */
      return err_make (err, EINVAL, "service-account key file `%s`: not a JSON object (line %d)", key_file,
                       jerr.line);
    }
  *out = root;
  return 0;
}

static void
auth_free_scope (gcs_auth_t **a)
{
  gcs_auth_free (*a);
}

/* Credentials freed when the scope ends, unless take_ptr handed them out. */
#define cleanup_auth __attribute__ ((cleanup (auth_free_scope)))

/* The RSA private key from `pem` into a->key. */
static int
load_private_key (gcs_auth_t *a, const char *pem, const char *key_file, err_t *err)
{
  BIO *bio = BIO_new_mem_buf (pem, -1);
  if (bio != NULL)
    a->key = PEM_read_bio_PrivateKey (bio, NULL, NULL, NULL);
  BIO_free (bio);
  if (a->key == NULL || EVP_PKEY_base_id (a->key) != EVP_PKEY_RSA)
    return err_make (err, EINVAL, "service-account key file `%s`: private_key is not an RSA key in PEM", key_file);
  return 0;
}

/* Checks the fields of the key JSON and makes the token source from them. */
static int
service_account_from_json (json_t *root, const char *key_file, const gcs_net_t *net, gcs_auth_t **out, err_t *err)
{
  const char *type = json_str (root, "type");
  const char *email = json_str (root, "client_email");
  const char *pem = json_str (root, "private_key");
  const char *uri = json_str (root, "token_uri");
  const char *kid = json_str (root, "private_key_id");
  if (type != NULL && strcmp (type, "service_account") != 0)
    return err_make (err, EINVAL, "credentials file `%s`: type `%.64s` is not supported (only service_account)",
                     key_file, type);
  if (email == NULL || email[0] == '\0' || pem == NULL)
    return err_make (err, EINVAL, "service-account key file `%s`: client_email or private_key missing", key_file);
  if (uri == NULL)
    uri = DEFAULT_TOKEN_URI;
  if (strncmp (uri, "https://", 8) != 0 && strncmp (uri, "http://", 7) != 0)
    return err_make (err, EINVAL, "service-account key file `%s`: token_uri `%.200s` is not an http(s) URL", key_file,
                     uri);
  if (strncmp (uri, "http://", 7) == 0 && !net->plain_http_ok)
    return err_make (err, EINVAL,
                     "service-account key file `%s`: token_uri `%.200s` is plain HTTP: refused (the signed "
                     "assertion and the token would travel unencrypted)",
                     key_file, uri);
  cleanup_auth gcs_auth_t *a = auth_alloc (AUTH_SERVICE_ACCOUNT, net);
  if (a == NULL)
    return err_make (err, ENOMEM, "service-account key file `%s`: out of memory", key_file);
  if (load_private_key (a, pem, key_file, err) < 0)
    return -1;
  a->client_email = strdup (email);
  a->token_uri = strdup (uri);
  a->key_id = kid != NULL ? strdup (kid) : NULL;
  if (a->client_email == NULL || a->token_uri == NULL || (kid != NULL && a->key_id == NULL)
      || asprintf (&a->describe, "service account `%s`", email) < 0)
    {
      a->describe = NULL;
      return err_make (err, ENOMEM, "service-account key file `%s`: out of memory", key_file);
    }
  *out = take_ptr (&a);
  return 0;
}

int
gcs_auth_new_service_account (const char *key_file, const gcs_net_t *net, gcs_auth_t **out, err_t *err)
{
  json_t *root = NULL;
  if (load_key_json (key_file, &root, err) < 0)
    return -1;
  int rc = service_account_from_json (root, key_file, net, out, err);
  const char *pem = json_str (root, "private_key");
  if (pem != NULL)
    OPENSSL_cleanse ((void *) pem, strlen (pem)); /* jansson's copy of the key */
  json_decref (root);
  return rc;
}

/* base64url(JSON of obj), or NULL. */
static char *
b64_json (json_t *obj)
{
  if (obj == NULL)
    return NULL;
  cleanup_free char *s = json_dumps (obj, JSON_COMPACT);
  json_decref (obj);
  if (s == NULL)
    return NULL;
  return gcs_base64url ((const uint8_t *) s, strlen (s));
}

/* The signed assertion "header.claims.signature" (RS256). */
static int
make_jwt (const gcs_auth_t *a, char **out, err_t *err)
{
  time_t now = time (NULL);
  json_t *hdr = a->key_id != NULL ? json_pack ("{s:s, s:s, s:s}", "alg", "RS256", "typ", "JWT", "kid", a->key_id)
                                  : json_pack ("{s:s, s:s}", "alg", "RS256", "typ", "JWT");
  json_t *claims = json_pack ("{s:s, s:s, s:s, s:I, s:I}", "iss", a->client_email, "scope",
                              a->scope != NULL ? a->scope : GCS_AUTH_SCOPE, "aud", a->token_uri, "iat",
                              (json_int_t) now, "exp", (json_int_t) now + 3600);
  cleanup_free char *h64 = b64_json (hdr);
  cleanup_free char *c64 = b64_json (claims);
  cleanup_free char *input = NULL;
  if (h64 == NULL || c64 == NULL || asprintf (&input, "%s.%s", h64, c64) < 0)
    {
      input = NULL;
      return err_make (err, ENOMEM, "%s: build the JWT: out of memory", a->describe);
    }
  EVP_MD_CTX *ctx = EVP_MD_CTX_new ();
  size_t siglen = 0;
  cleanup_free unsigned char *sig = NULL;
  int ok = ctx != NULL && EVP_DigestSignInit (ctx, NULL, EVP_sha256 (), NULL, a->key) == 1
           && EVP_DigestSign (ctx, NULL, &siglen, (const unsigned char *) input, strlen (input)) == 1
           && (sig = malloc (siglen)) != NULL
           && EVP_DigestSign (ctx, sig, &siglen, (const unsigned char *) input, strlen (input)) == 1;
  EVP_MD_CTX_free (ctx);
  if (!ok)
    return err_make (err, EIO, "%s: sign the JWT with the private key: OpenSSL failed", a->describe);
  cleanup_free char *s64 = gcs_base64url (sig, siglen);
  if (s64 == NULL || asprintf (out, "%s.%s", input, s64) < 0)
    return err_make (err, ENOMEM, "%s: build the JWT: out of memory", a->describe);
  return 0;
}

/* ---- metadata server ----------------------------------------------------- */

int
gcs_auth_new_metadata (const char *host, const gcs_net_t *net, gcs_auth_t **out, err_t *err)
{
  if (host == NULL || host[0] == '\0')
    host = DEFAULT_METADATA_HOST;
  size_t hlen = strlen (host);
  while (hlen > 0 && host[hlen - 1] == '/')
    hlen--;
  const char *scheme = strstr (host, "://") != NULL ? "" : "http://";
  cleanup_auth gcs_auth_t *a = auth_alloc (AUTH_METADATA, net);
  if (a == NULL)
    return err_make (err, ENOMEM, "metadata server `%s`: out of memory", host);
  if (asprintf (&a->metadata_url, "%s%.*s%s", scheme, (int) hlen, host, METADATA_TOKEN_PATH) < 0)
    a->metadata_url = NULL;
  if (a->metadata_url == NULL || asprintf (&a->describe, "metadata server `%.*s`", (int) hlen, host) < 0)
    {
      a->describe = NULL;
      return err_make (err, ENOMEM, "metadata server `%s`: out of memory", host);
    }
  *out = take_ptr (&a);
  return 0;
}

/* ---- fetching and caching ------------------------------------------------ */

/* A token goes into a request header: printable, no blanks, bounded. */
static int
token_is_sane (const char *t)
{
  size_t n = strlen (t);
  if (n == 0 || n > TOKEN_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char) t[i] <= 0x20 || (unsigned char) t[i] >= 0x7f)
      return 0;
  return 1;
}

/* Parses {"access_token": …, "expires_in": …} into the cache. */
static int
store_token (gcs_auth_t *a, const gcs_resp_t *resp, const char *where, err_t *err)
{
  json_error_t jerr;
  json_t *root
      = resp->body != NULL && !resp->body_truncated ? json_loadb (resp->body, resp->body_len, 0, &jerr) : NULL;
  const char *tok = json_str (root, "access_token");
  json_t *exp = json_object_get (root, "expires_in");
  if (tok == NULL || !token_is_sane (tok))
    {
      json_decref (root);
      return err_make (err, EIO, "%s: `%s` answered without a usable access_token", a->describe, where);
    }
  json_int_t secs = json_is_integer (exp) ? json_integer_value (exp)
                    : json_is_real (exp)  ? (json_int_t) json_real_value (exp)
                                          : 3600;
  if (secs < 0)
    secs = 0;
  if (secs > 24 * 3600)
    secs = 24 * 3600;
  free_secret (a->token);
  a->token = strdup (tok);
  OPENSSL_cleanse ((void *) tok, strlen (tok));
  json_decref (root);
  if (a->token == NULL)
    return err_make (err, ENOMEM, "%s: out of memory", a->describe);
  a->expires_ms = gcs_now_ms () + (uint64_t) secs * 1000u;
  return 0;
}

/* The token request of `a` into *req: a POST of a signed JWT to the key's
 * token_uri, or a GET from the metadata server. *body (the form, which
 * holds the assertion) and *hdrs are the caller's to release. */
static int
token_request (gcs_auth_t *a, gcs_req_t *req, char **body, struct curl_slist **hdrs, err_t *err)
{
  if (a->kind == AUTH_SERVICE_ACCOUNT)
    {
      cleanup_free char *jwt = NULL;
      if (make_jwt (a, &jwt, err) < 0)
        return -1;
      if (asprintf (body, "grant_type=urn%%3Aietf%%3Aparams%%3Aoauth%%3Agrant-type%%3Ajwt-bearer&assertion=%s", jwt)
          < 0)
        {
          *body = NULL;
          return err_make (err, ENOMEM, "%s: out of memory", a->describe);
        }
      *hdrs = curl_slist_append (NULL, "Content-Type: application/x-www-form-urlencoded");
      req->url = a->token_uri;
      req->method = "POST";
      req->body = *body;
      req->body_len = strlen (*body);
    }
  else
    {
      *hdrs = curl_slist_append (NULL, "Metadata-Flavor: Google");
      req->url = a->metadata_url;
      req->method = "GET";
    }
  if (*hdrs == NULL)
    return err_make (err, ENOMEM, "%s: out of memory", a->describe);
  req->headers = *hdrs;
  return 0;
}

/* Performs the token request until it is answered 200 (the token goes into
 * the cache), refused (EACCES) or the retry budget runs out (ETIMEDOUT).
 * The answer, which holds the token, is cleansed. */
static int
token_exchange (gcs_auth_t *a, CURL *h, const gcs_req_t *req, err_t *err)
{
  gcs_resp_t resp = {0};
  gcs_retry_t retry;
  gcs_retry_init (&retry, a->net);
  int rc = -1;
  for (;;)
    {
      if (gcs_http_do (h, a->net, req, &resp, err) < 0)
        break;
      if (resp.rc == CURLE_OK && resp.status == 200)
        {
          rc = store_token (a, &resp, req->url, err);
          break;
        }
      cleanup_free char *what = gcs_resp_describe (&resp);
      if (!gcs_resp_retryable (&resp))
        {
          err_make (err, EACCES, "%s: `%s` refused the credentials: %s", a->describe, req->url, what ? what : "?");
          break;
        }
      log_fields (SEV_WARNING, json_pack ("{s:s, s:s}", "credentials", a->describe, "failure", what ? what : "?"),
                  "fetching an access token failed; retrying");
      if (gcs_retry_wait (&retry) < 0)
        {
          err_make (err, ETIMEDOUT, "%s: no access token from `%s` after %.1f s of retries: %s", a->describe,
                    req->url, gcs_retry_elapsed_s (&retry), what ? what : "?");
          break;
        }
    }
  if (resp.body != NULL)
    OPENSSL_cleanse (resp.body, resp.body_len);
  gcs_resp_clear (&resp);
  return rc;
}

/* One fetch with retries; a->mu held. */
static int
fetch_token (gcs_auth_t *a, err_t *err)
{
  cleanup_free char *body = NULL;
  struct curl_slist *hdrs = NULL;
  gcs_req_t req = {.timeout_s = TOKEN_REQUEST_TIMEOUT_S};
  if (token_request (a, &req, &body, &hdrs, err) < 0)
    return -1;
  CURL *h = curl_easy_init ();
  if (h == NULL)
    {
      curl_slist_free_all (hdrs);
      return err_make (err, ENOMEM, "%s: create a curl handle: out of memory", a->describe);
    }
  int rc = token_exchange (a, h, &req, err);
  curl_easy_cleanup (h);
  curl_slist_free_all (hdrs);
  if (body != NULL)
    OPENSSL_cleanse (body, strlen (body));
  return rc;
}

int
gcs_auth_header (gcs_auth_t *auth, char **out, err_t *err)
{
  *out = NULL;
  if (auth == NULL)
    return 0;
  pthread_mutex_lock (&auth->mu);
  int rc = 0;
  if (auth->token == NULL || gcs_now_ms () + TOKEN_EARLY_MS >= auth->expires_ms)
    rc = fetch_token (auth, err);
  if (rc == 0 && asprintf (out, "Authorization: Bearer %s", auth->token) < 0)
    {
      *out = NULL;
      rc = err_make (err, ENOMEM, "%s: out of memory", auth->describe);
    }
  pthread_mutex_unlock (&auth->mu);
  return rc;
}

void
gcs_auth_invalidate (gcs_auth_t *auth)
{
  if (auth == NULL)
    return;
  pthread_mutex_lock (&auth->mu);
  free_secret (auth->token);
  auth->token = NULL;
  pthread_mutex_unlock (&auth->mu);
}

void
gcs_auth_set_scope (gcs_auth_t *auth, const char *scope)
{
  auth->scope = scope;
}
