/* image/pull: one pull — the manifest (an index or a manifest list first:
 * its linux/amd64 entry), the config, every missing layer; each blob
 * checked against its SHA-256 digest as it streams and used only once it
 * matched, each cap checked before a byte is fetched (declared sizes) and
 * while fetching (actual bytes). The blobs come from a registry or from a
 * template's layout in the store (template.c): one pull for both. Every
 * blob is kept as fetched (blobs/<hex>) beside its unpacked layer, for the
 * templates made on the image. Runs with its reference claimed (gate.h). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <fnmatch.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/image/internal.h"
#include "gateway/image/registry.h"

#define ACCEPT_MANIFESTS                                                                                             \
  "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, "             \
  "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"

/* A blob as it streams: hashed, and kept in memory (mem) or written to fd. */
typedef struct blob_sink_s
{
  EVP_MD_CTX *md;
  char *mem;
  size_t len, cap;
  int fd;
  uint64_t bytes;
  const img_pull_opts_t *o;
} blob_sink_t;

static int
on_blob (void *ctx, const uint8_t *data, size_t len)
{
  blob_sink_t *b = ctx;
  EVP_DigestUpdate (b->md, data, len);
  b->bytes += len;
  if (b->fd >= 0)
    {
      for (size_t off = 0; off < len;)
        {
          ssize_t w = TEMP_FAILURE_RETRY (write (b->fd, data + off, len - off));
          if (w <= 0)
            return -1;
          off += (size_t) w;
        }
      return 0;
    }
  if (b->len + len > b->cap)
    {
      size_t cap = b->cap ? b->cap : 64 * 1024;
      while (cap < b->len + len)
        cap *= 2;
      char *m = realloc (b->mem, cap + 1);
      if (m == NULL)
        return -1;
      b->mem = m;
      b->cap = cap;
    }
  memcpy (b->mem + b->len, data, len);
  b->len += len;
  b->mem[b->len] = '\0';
  return 0;
}

/* Fetches `kind` `ref` (at most max bytes) into *b and checks it against
 * `want` ("sha256:<hex>", or NULL: none to check). Its digest into got. */
static int
fetch (const img_src_t *src, const char *image, const char *kind, const char *ref, const char *want, uint64_t max,
       blob_sink_t *b, char *got, char *ctype, err_t *err)
{
  b->md = EVP_MD_CTX_new ();
  if (b->md == NULL || EVP_DigestInit_ex (b->md, EVP_sha256 (), NULL) != 1)
    return err_make (err, ENOMEM, "out of memory");
  char ignored[IMG_HEADER_MAX];
  int rc = src->get (src->ctx, kind, ref, kind[0] == 'm' ? ACCEPT_MANIFESTS : NULL, max, on_blob, b,
                     ctype != NULL ? ctype : ignored, err);
  unsigned char md[32];
  unsigned int n = 0;
  EVP_DigestFinal_ex (b->md, md, &n);
  EVP_MD_CTX_free (b->md);
  b->md = NULL;
  if (rc < 0)
    return -1;
  strcpy (got, "sha256:");
  for (int i = 0; i < 32; i++)
    sprintf (got + 7 + 2 * i, "%02x", md[i]);
  if (want != NULL && strcmp (got, want) != 0)
    return err_make (err, EINVAL, "image `%s`: %s `%s` does not match its digest (got %s)", image, kind, want, got);
  return 0;
}

/* The digest and size of a descriptor, checked. */
static int
descriptor (json_t *d, const char *image, const char *what, const char **digest, uint64_t *size, uint64_t cap,
            err_t *err)
{
  *digest = json_string_value (json_object_get (d, "digest"));
  json_t *sz = json_object_get (d, "size");
  if (*digest == NULL || !img_digest_valid (*digest) || !json_is_integer (sz) || json_integer_value (sz) < 0)
    return err_make (err, EINVAL, "image `%s`: a %s descriptor without a sha256 digest and a size", image, what);
  *size = (uint64_t) json_integer_value (sz);
  if (*size > cap)
    return err_make (err, EINVAL, "image `%s`: its %s is %llu bytes, over the cap of %llu", image, what,
                     (unsigned long long) *size, (unsigned long long) cap);
  return 0;
}

int
img_keep_blob (img_cache_t *c, const char *digest, const void *data, size_t len, err_t *err)
{
  char tmp[PATH_MAX], path[PATH_MAX];
  snprintf (path, sizeof path, "%s/blobs/%s", img_cache_root (c), digest + 7);
  snprintf (tmp, sizeof tmp, "%s/tmp/%s.kept.%lu", img_cache_root (c), digest + 7, (unsigned long) pthread_self ());
  cleanup_close int fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return err_make_sys (err, errno, "create `%s`", tmp);
  for (size_t off = 0; off < len;)
    {
      ssize_t w = TEMP_FAILURE_RETRY (write (fd, (const char *) data + off, len - off));
      if (w <= 0)
        {
          unlink (tmp);
          return err_make_sys (err, w < 0 ? errno : EIO, "write `%s`", tmp);
        }
      off += (size_t) w;
    }
  if (rename (tmp, path) < 0)
    {
      unlink (tmp);
      return err_make_sys (err, errno, "rename `%s`", path);
    }
  return 0;
}

/* The manifest: by tag or digest, through an index to its linux/amd64
 * entry. The manifest's JSON into *out, its digest into dg. */
static int
fetch_manifest (img_cache_t *c, const img_src_t *r, const char *ref, const img_ref_t *p, json_t **out, char *dg,
                err_t *err)
{
  const char *want = p->digest[0] != '\0' ? p->digest : NULL;
  char first[SBX_IMAGE_DIGEST_MAX + 1] = "", picked[SBX_IMAGE_DIGEST_MAX + 1];
  for (int depth = 0; depth < 2; depth++)
    {
      blob_sink_t b = {.fd = -1};
      char ctype[IMG_HEADER_MAX];
      int rc = fetch (r, ref, "manifests", want != NULL ? want : p->tag, want, IMG_MANIFEST_MAX, &b, dg, ctype, err);
      json_error_t jerr;
      json_t *doc = rc == 0 ? json_loadb (b.mem != NULL ? b.mem : "", b.len, 0, &jerr) : NULL;
      json_t *list = json_object_get (doc, "manifests");
      if (rc == 0 && json_is_object (doc) && list == NULL)
        rc = img_keep_blob (c, dg, b.mem, b.len, err);
      free (b.mem);
      if (rc < 0)
        {
          json_decref (doc);
          return -1;
        }
      if (!json_is_object (doc))
        {
          json_decref (doc);
          return err_make (err, EINVAL, "image `%s`: the manifest is not a JSON object", ref);
        }
      if (list == NULL)
        {
          *out = doc;
          return 0;
        }
      if (depth == 0)
        snprintf (first, sizeof first, "%s", dg);
      const char *pick = NULL;
      for (size_t i = 0; i < json_array_size (list) && pick == NULL; i++)
        {
          json_t *m = json_array_get (list, i), *pf = json_object_get (m, "platform");
          const char *os = json_string_value (json_object_get (pf, "os"));
          const char *arch = json_string_value (json_object_get (pf, "architecture"));
          const char *d = json_string_value (json_object_get (m, "digest"));
          if (os != NULL && arch != NULL && strcmp (os, "linux") == 0 && strcmp (arch, "amd64") == 0 && d != NULL
              && img_digest_valid (d))
            pick = d;
        }
      if (pick == NULL || depth == 1)
        {
          json_decref (doc);
          return err_make (err, EINVAL, "image `%s`: its index has no linux/amd64 manifest", ref);
        }
      snprintf (picked, sizeof picked, "%s", pick);
      want = picked;
      json_decref (doc);
    }
  return err_make (err, EINVAL, "image `%s`: nested indexes", ref);
}

/* The config's Env, WorkingDir and User, and its digest, into the record. */
static int
read_config (img_cache_t *c, const img_src_t *r, const char *ref, json_t *manifest, json_t *record, err_t *err)
{
  const char *digest;
  uint64_t size;
  if (descriptor (json_object_get (manifest, "config"), ref, "config", &digest, &size, IMG_CONFIG_MAX, err) < 0)
    return -1;
  blob_sink_t b = {.fd = -1};
  char got[SBX_IMAGE_DIGEST_MAX + 1];
  int rc = fetch (r, ref, "blobs", digest, digest, IMG_CONFIG_MAX, &b, got, NULL, err);
  json_error_t jerr;
  json_t *doc = rc == 0 ? json_loadb (b.mem != NULL ? b.mem : "", b.len, 0, &jerr) : NULL;
  if (rc == 0 && doc != NULL)
    rc = img_keep_blob (c, digest, b.mem, b.len, err);
  free (b.mem);
  if (rc < 0)
    return -1;
  json_t *cfg = json_object_get (doc, "config"), *env = json_object_get (cfg, "Env");
  if (doc == NULL || json_array_size (env) > IMG_MAX_ENV)
    {
      json_decref (doc);
      return err_make (err, EINVAL, "image `%s`: a config that is not JSON or has more than %d Env entries", ref,
                       IMG_MAX_ENV);
    }
  json_t *e = json_array ();
  for (size_t i = 0; i < json_array_size (env); i++)
    {
      const char *v = json_string_value (json_array_get (env, i));
      if (v != NULL && strchr (v, '=') != NULL && v[0] != '=')
        json_array_append_new (e, json_string (v));
    }
  json_object_set_new (record, "env", e);
  const char *wd = json_string_value (json_object_get (cfg, "WorkingDir"));
  const char *user = json_string_value (json_object_get (cfg, "User"));
  json_object_set_new (record, "workdir", json_string (wd != NULL && wd[0] == '/' ? wd : ""));
  json_object_set_new (record, "user", json_string (user != NULL ? user : ""));
  json_object_set_new (record, "config", json_string (digest + 7));
  json_decref (doc);
  return 0;
}

static bool
layer_type_ok (const char *t)
{
  static const char *const ok[]
      = {"application/vnd.oci.image.layer.v1.tar",       "application/vnd.oci.image.layer.v1.tar+gzip",
         "application/vnd.oci.image.layer.v1.tar+zstd",  "application/vnd.docker.image.rootfs.diff.tar.gzip",
         "application/vnd.docker.image.rootfs.diff.tar", NULL};
  for (size_t i = 0; t != NULL && ok[i] != NULL; i++)
    if (strcmp (t, ok[i]) == 0)
      return true;
  return false;
}

/* Blob `digest` into fd (rewound), checked against its digest and size. */
static int
fetch_to_fd (const img_src_t *r, const char *ref, const char *digest, uint64_t size, int fd, err_t *err)
{
  blob_sink_t b = {.fd = fd};
  char got[SBX_IMAGE_DIGEST_MAX + 1];
  if (fetch (r, ref, "blobs", digest, digest, size, &b, got, NULL, err) < 0)
    return -1;
  if (b.bytes != size)
    return err_make (err, EINVAL, "image `%s`: layer %s is %llu bytes, its manifest says %llu", ref, digest,
                     (unsigned long long) b.bytes, (unsigned long long) size);
  if (lseek (fd, 0, SEEK_SET) < 0)
    return err_make_sys (err, errno, "rewind the blob of %s", digest);
  return 0;
}

/* One layer into layers/<hex> and its blob into blobs/<hex>: fetched to
 * tmp, verified, unpacked into a temporary directory, each renamed in
 * place once whole. A layer cached without its blob (a cache older than
 * kept blobs) gets the blob only. */
static int
make_layer (img_cache_t *c, const img_src_t *r, const char *ref, const char *digest, uint64_t size, err_t *err)
{
  const char *root = img_cache_root (c), *hex = digest + 7;
  char final[PATH_MAX], kept[PATH_MAX], blob[PATH_MAX], dir[PATH_MAX];
  snprintf (final, sizeof final, "%s/layers/%s", root, hex);
  snprintf (kept, sizeof kept, "%s/blobs/%s", root, hex);
  struct stat st;
  bool have_layer = stat (final, &st) == 0;
  if (have_layer && stat (kept, &st) == 0)
    return 0; /* shared with an image pulled before */
  snprintf (blob, sizeof blob, "%s/tmp/%s.blob", root, hex);
  snprintf (dir, sizeof dir, "%s/tmp/%s.dir", root, hex);
  sbx_layer_remove (dir);
  cleanup_close int fd = open (blob, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return err_make_sys (err, errno, "create `%s`", blob);
  int rc = fetch_to_fd (r, ref, digest, size, fd, err);
  if (rc == 0 && !have_layer && mkdir (dir, 0755) < 0)
    rc = err_make_sys (err, errno, "mkdir `%s`", dir);
  if (rc == 0 && !have_layer && sbx_unpack_layer (img_cache_runtime (c), fd, dir, IMG_UNPACK_MS, err) < 0)
    rc = err_wrap (err, "image `%s`: layer %s", ref, digest);
  if (rc == 0 && !have_layer && rename (dir, final) < 0)
    rc = err_make_sys (err, errno, "rename `%s`", final);
  if (rc == 0 && rename (blob, kept) < 0)
    rc = err_make_sys (err, errno, "rename `%s`", kept);
  if (rc < 0)
    {
      unlink (blob);
      sbx_layer_remove (dir);
    }
  return rc;
}

/* make_layer with the layer claimed: another pull making it meanwhile is
 * waited for (until this pull's deadline), and then found in place. */
static int
pull_layer (img_cache_t *c, const img_src_t *r, const char *ref, const char *digest, uint64_t size,
            const img_pull_opts_t *o, err_t *err)
{
  char key[80];
  snprintf (key, sizeof key, "layer:%s", digest + 7);
  int rc = img_gate_claim (img_cache_gate (c), key, o->deadline_mono_ms);
  if (rc != 0)
    return err_make (err, rc, "image `%s`: layer %s: another pull making it ran past this call's deadline", ref,
                     digest);
  rc = make_layer (c, r, ref, digest, size, err);
  img_gate_release (img_cache_gate (c), key);
  return rc;
}

static void
report (const img_pull_opts_t *o, const img_progress_t *p)
{
  if (o->progress != NULL)
    o->progress (o->progress_ctx, p);
}

/* The layers of `manifest`, checked, then each pulled; their hex digests
 * into the record (base first). */
static int
pull_layers (img_cache_t *c, const img_src_t *r, const char *ref, json_t *manifest, json_t *record,
             const img_pull_opts_t *o, err_t *err)
{
  json_t *layers = json_object_get (manifest, "layers");
  size_t n = json_array_size (layers);
  if (!json_is_array (layers) || n == 0)
    return err_make (err, EINVAL, "image `%s`: a manifest without layers", ref);
  if (n > IMG_MAX_LAYERS)
    return err_make (err, EINVAL, "image `%s`: %zu layers, more than the cap of %d", ref, n, IMG_MAX_LAYERS);
  img_progress_t p = {.layers_total = (unsigned) n};
  json_t *hexes = json_array (), *media = json_array (), *sizes = json_array ();
  json_object_set_new (record, "layers", hexes);
  json_object_set_new (record, "media", media);
  json_object_set_new (record, "sizes", sizes);
  for (size_t i = 0; i < n; i++)
    {
      const char *digest;
      uint64_t size;
      json_t *l = json_array_get (layers, i);
      if (descriptor (l, ref, "layer", &digest, &size, IMG_LAYER_MAX, err) < 0)
        return -1;
      if (!layer_type_ok (json_string_value (json_object_get (l, "mediaType"))))
        return err_make (err, EINVAL, "image `%s`: layer %zu has media type `%.100s`, not a tar (plain, gzip, zstd)",
                         ref, i, json_string_value (json_object_get (l, "mediaType")) ?: "");
      p.bytes_total += size;
      if (p.bytes_total > IMG_TOTAL_MAX)
        return err_make (err, EINVAL, "image `%s`: its layers total more than the cap of %llu bytes", ref,
                         (unsigned long long) IMG_TOTAL_MAX);
      json_array_append_new (hexes, json_string (digest + 7));
      json_array_append_new (media, json_string (json_string_value (json_object_get (l, "mediaType"))));
      json_array_append_new (sizes, json_integer ((json_int_t) size));
    }
  json_object_set_new (record, "bytes", json_integer ((json_int_t) p.bytes_total));
  report (o, &p);
  for (size_t i = 0; i < n; i++)
    {
      const char *digest;
      uint64_t size;
      descriptor (json_array_get (layers, i), ref, "layer", &digest, &size, IMG_LAYER_MAX, err);
      if (pull_layer (c, r, ref, digest, size, o, err) < 0)
        return -1;
      p.layers_done++;
      p.bytes_done += size;
      report (o, &p);
    }
  return 0;
}

/* The Basic credentials SANDBOX_REGISTRY_AUTH_FILE has for `host`: its
 * "auth" (base64 of user:password), or "username" and "password". */
static char *
credentials_for (const char *auth_file, const char *host)
{
  if (auth_file == NULL)
    return NULL;
  json_error_t jerr;
  json_t *doc = json_load_file (auth_file, 0, &jerr);
  json_t *auths = json_object_get (doc, "auths"), *entry = json_object_get (auths, host);
  if (entry == NULL && strcmp (host, "registry-1.docker.io") == 0)
    entry = json_object_get (auths, "https://index.docker.io/v1/");
  const char *b64 = json_string_value (json_object_get (entry, "auth"));
  const char *user = json_string_value (json_object_get (entry, "username"));
  const char *pass = json_string_value (json_object_get (entry, "password"));
  char *out = NULL;
  if (b64 != NULL
      && strspn (b64, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") == strlen (b64))
    out = strdup (b64);
  else if (user != NULL && pass != NULL)
    {
      cleanup_free char *plain = NULL;
      int n = asprintf (&plain, "%s:%s", user, pass);
      if (n > 0 && (out = malloc (4 * ((size_t) n / 3 + 1) + 1)) != NULL)
        EVP_EncodeBlock ((unsigned char *) out, (const unsigned char *) plain, n);
    }
  json_decref (doc);
  return out;
}

int
img_pull_from (img_cache_t *c, const img_src_t *src, const char *ref, const img_ref_t *p, const img_pull_opts_t *o,
               json_t *record, char *dg, err_t *err)
{
  json_t *manifest = NULL;
  int rc = fetch_manifest (c, src, ref, p, &manifest, dg, err);
  if (rc == 0)
    {
      json_object_set_new (record, "ref", json_string (ref));
      json_object_set_new (record, "digest", json_string (dg));
      json_object_set_new (record, "annotations", json_deep_copy (json_object_get (manifest, "annotations")));
      rc = read_config (c, src, ref, manifest, record, err);
    }
  if (rc == 0)
    rc = pull_layers (c, src, ref, manifest, record, o, err);
  /* A template made on the default image runs over it (template.c). */
  const char *base
      = json_string_value (json_object_get (json_object_get (manifest, "annotations"), IMG_ANNOTATION_BASE));
  if (rc == 0 && json_is_true (json_object_get (record, "template")) && base != NULL && strcmp (base, "rootfs") == 0)
    json_object_set_new (record, "on_rootfs", json_true ());
  if (rc == 0)
    rc = img_record (c, ref, dg, record, err);
  json_decref (manifest);
  return rc;
}

static int
registry_get (void *ctx, const char *kind, const char *ref, const char *accept, uint64_t max, img_sink_fn sink,
              void *sink_ctx, char *ctype, err_t *err)
{
  return img_reg_get (ctx, kind, ref, accept, max, sink, sink_ctx, ctype, err);
}

/* The Basic credentials (base64) of `oauth2accesstoken` and a Google
 * access token, for the registries of SANDBOX_REGISTRY_GOOGLE_HOSTS
 * (Artifact Registry); NULL for the others, and when no token could be
 * had (logged: the pull goes on anonymously). */
static char *
google_basic (img_cache_t *c, const char *host)
{
  const img_google_t *g = img_cache_google (c);
  if (g->token == NULL || g->hosts == NULL)
    return NULL;
  bool listed = false;
  cleanup_free char *list = strdup (g->hosts);
  char *save = NULL;
  for (char *p = list != NULL ? strtok_r (list, ",", &save) : NULL; p != NULL && !listed;
       p = strtok_r (NULL, ",", &save))
    listed = fnmatch (p, host, 0) == 0;
  char *token = NULL;
  err_t err = ERR_INIT;
  if (!listed)
    return NULL;
  if (g->token (g->ctx, &token, &err) < 0)
    {
      err_warn_release (&err, "registry `%s`: no Google credentials; pulling anonymously", host);
      return NULL;
    }
  cleanup_free char *plain = NULL;
  char *out = NULL;
  int n = asprintf (&plain, "oauth2accesstoken:%s", token);
  g->put (token);
  if (n > 0 && (out = malloc (4 * ((size_t) n / 3 + 1) + 1)) != NULL)
    EVP_EncodeBlock ((unsigned char *) out, (const unsigned char *) plain, n);
  if (plain != NULL)
    OPENSSL_cleanse (plain, strlen (plain));
  return out;
}

int
img_pull_locked (img_cache_t *c, const char *ref, const img_ref_t *p, const char *auth_file, const char *insecure,
                 const img_pull_opts_t *o, char *dg, err_t *err)
{
  cleanup_free char *basic = credentials_for (auth_file, p->host);
  if (basic == NULL)
    basic = google_basic (c, p->host);
  img_reg_opts_t ro = {.host = p->host,
                       .repo = p->repo,
                       .insecure = img_reg_host_listed (insecure, p->host),
                       .plain_hosts = insecure,
                       .basic_b64 = basic,
                       .ca_file = img_cache_ca_file (c),
                       .deadline_mono_ms = o->deadline_mono_ms,
                       .cancelled = o->cancelled,
                       .cancel_ctx = o->cancel_ctx,
                       .image = ref};
  img_reg_t *r = NULL;
  if (img_reg_new (&ro, &r, err) < 0)
    return -1;
  img_src_t src = {.get = registry_get, .ctx = r};
  json_t *record = json_object ();
  int rc = record != NULL ? img_pull_from (c, &src, ref, p, o, record, dg, err)
                          : err_make (err, ENOMEM, "out of memory");
  json_decref (record);
  img_reg_free (r);
  return rc;
}
