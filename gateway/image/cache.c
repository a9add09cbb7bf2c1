/* image/cache: the layer cache and the pull (see image.h). The pull here
 * decides what to fetch and checks it; registry.c fetches, the runtime's
 * unprivileged helper unpacks. */
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/image/gate.h"
#include "gateway/image/image.h"
#include "gateway/image/internal.h"
#include "gateway/image/ref.h"
#include "gateway/image/registry.h"

struct img_cache_s
{
  char root[PATH_MAX / 2]; /* <state>/images */
  char *auth_file, *insecure, *ca_file;
  sbx_runtime_t *rt;
  uint64_t budget; /* SANDBOX_IMAGE_CACHE_MB in bytes; 0: none */
  img_gate_t gate; /* pulls side by side, removals alone (gate.h) */
  snap_store_t *store;
  img_google_t google;
};

static const char *const subdirs[] = {"", "/blobs", "/layers", "/manifests", "/refs", "/tmp"};

int
img_cache_new (const img_cache_opts_t *o, img_cache_t **out, err_t *err)
{
  cleanup_free img_cache_t *c = calloc (1, sizeof *c);
  if (c == NULL)
    return err_make (err, ENOMEM, "out of memory");
  if (snprintf (c->root, sizeof c->root, "%s/images", o->state_dir) >= (int) sizeof c->root)
    return err_make (err, ENAMETOOLONG, "SANDBOX_STATE_DIR is too long");
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/tmp", c->root);
  sbx_layer_remove (path); /* what a previous run left half made */
  for (size_t i = 0; i < sizeof subdirs / sizeof subdirs[0]; i++)
    {
      snprintf (path, sizeof path, "%s%s", c->root, subdirs[i]);
      /* Only root may walk in: the layers hold the images' files. */
      if (mkdir (path, 0700) < 0 && errno != EEXIST)
        return err_make_sys (err, errno, "mkdir `%s`", path);
    }
  c->auth_file = o->auth_file != NULL ? strdup (o->auth_file) : NULL;
  c->insecure = o->insecure_registries != NULL ? strdup (o->insecure_registries) : NULL;
  c->ca_file = o->ca_file != NULL ? strdup (o->ca_file) : NULL;
  c->rt = o->rt;
  c->store = o->store;
  c->google = (img_google_t){.hosts = o->google_hosts != NULL ? strdup (o->google_hosts) : NULL,
                             .token = o->google_token,
                             .put = o->google_token_put,
                             .ctx = o->google_ctx};
  c->budget = (uint64_t) o->cache_mb << 20;
  /* Before any thread pulls (curl's own lazy set-up is not thread-safe). */
  if (curl_global_init (CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return err_make (err, EIO, "curl_global_init");
  img_gate_init (&c->gate);
  *out = take_ptr (&c);
  return 0;
}

void
img_cache_free (img_cache_t *c)
{
  if (c == NULL)
    return;
  img_gate_destroy (&c->gate);
  free (c->auth_file);
  free (c->insecure);
  free (c->ca_file);
  free (c->google.hosts);
  free (c);
}

void
img_release (img_t *img)
{
  free (img->layers);
  img_env_free (img->env);
  free (img->workdir);
  free (img->user);
  memset (img, 0, sizeof *img);
}

/* The hex SHA-256 of `s`, into hex (65 bytes). */
static void
sha256_hex (const void *data, size_t len, char *hex)
{
  unsigned char md[32];
  unsigned int n = 0;
  EVP_Digest (data, len, md, &n, EVP_sha256 (), NULL);
  for (int i = 0; i < 32; i++)
    sprintf (hex + 2 * i, "%02x", md[i]);
}

/* Writes `doc` to `path` atomically (a temporary file renamed). */
static int
write_json (const img_cache_t *c, const char *path, json_t *doc, err_t *err)
{
  char tmp[PATH_MAX];
  snprintf (tmp, sizeof tmp, "%s/tmp/record.%d.%lu", c->root, (int) getpid (), (unsigned long) pthread_self ());
  if (json_dump_file (doc, tmp, JSON_COMPACT) < 0)
    return err_make (err, EIO, "write `%s`", tmp);
  if (rename (tmp, path) < 0)
    {
      unlink (tmp);
      return err_make_sys (err, errno, "rename `%s`", path);
    }
  return 0;
}

/* Reads the record of manifest digest `digest` into *out. ENOENT none or a
 * layer gone. */
static int
read_record (img_cache_t *c, const char *digest, img_t *out, err_t *err)
{
  memset (out, 0, sizeof *out);
  if (!img_digest_valid (digest))
    return err_make (err, EINVAL, "`%.80s` is not a manifest digest", digest);
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/manifests/%s", c->root, digest + 7);
  json_error_t jerr;
  json_t *doc = json_load_file (path, 0, &jerr);
  if (doc == NULL)
    return err_make (err, ENOENT, "image `%s` is not cached", digest);
  json_t *layers = json_object_get (doc, "layers"), *env = json_object_get (doc, "env");
  size_t n = json_array_size (layers), ne = json_array_size (env);
  snprintf (out->ref, sizeof out->ref, "%s", json_string_value (json_object_get (doc, "ref")) ?: "");
  snprintf (out->digest, sizeof out->digest, "%s", digest);
  out->n_layers = (unsigned) n;
  out->bytes = (uint64_t) json_integer_value (json_object_get (doc, "bytes"));
  const char *wd = json_string_value (json_object_get (doc, "workdir"));
  const char *user = json_string_value (json_object_get (doc, "user"));
  snprintf (out->gen, sizeof out->gen, "%s", json_string_value (json_object_get (doc, "gen")) ?: "");
  out->workdir = wd != NULL && wd[0] != '\0' ? strdup (wd) : NULL;
  out->user = user != NULL && user[0] != '\0' ? strdup (user) : NULL;
  bool on_rootfs = json_is_true (json_object_get (doc, "on_rootfs"));
  out->env = calloc (ne + 1, sizeof *out->env);
  out->on_rootfs = on_rootfs;
  out->layers = calloc (n + 1, strlen (c->root) + 8 + 64 + 2);
  int rc = out->env == NULL || out->layers == NULL ? err_make (err, ENOMEM, "out of memory") : 0;
  for (size_t i = 0; rc == 0 && i < ne; i++)
    if ((out->env[i] = strdup (json_string_value (json_array_get (env, i)) ?: "")) == NULL)
      rc = err_make (err, ENOMEM, "out of memory");
  /* Overlay's lowerdir lists the top layer first; a manifest the base. */
  for (size_t i = n; rc == 0 && i-- > 0;)
    {
      const char *hex = json_string_value (json_array_get (layers, i));
      struct stat st;
      char kept[PATH_MAX];
      snprintf (path, sizeof path, "%s/layers/%s", c->root, hex != NULL ? hex : "");
      /* A template made on the default image keeps only its layer's blob. */
      snprintf (kept, sizeof kept, "%s/blobs/%s", c->root, hex != NULL ? hex : "");
      if (hex == NULL || strlen (hex) != 64 || stat (on_rootfs ? kept : path, &st) < 0)
        rc = err_make (err, ENOENT, "image `%s`: a layer is no longer cached", digest);
      else
        {
          strcat (out->layers, path);
          if (i > 0)
            strcat (out->layers, ":");
        }
    }
  if (rc == 0 && on_rootfs && n != 1)
    rc = err_make (err, EINVAL, "template `%s`: made on the default image with %zu layers, not one", digest, n);
  json_decref (doc);
  if (rc < 0)
    img_release (out);
  return rc;
}

/* Marks the image of `digest` used now (the eviction's order). */
static void
touch_record (img_cache_t *c, const char *digest)
{
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/manifests/%s", c->root, digest + 7);
  utimensat (AT_FDCWD, path, NULL, 0);
}

int
img_get (img_cache_t *c, const char *digest, img_t *out, err_t *err)
{
  int rc = read_record (c, digest, out, err);
  if (rc == 0)
    touch_record (c, digest);
  return rc;
}

/* The manifest digest reference `ref` was last pulled as, into dg. */
static int
lookup_ref (img_cache_t *c, const char *ref, char dg[SBX_IMAGE_DIGEST_MAX + 1])
{
  char hex[65], path[PATH_MAX];
  sha256_hex (ref, strlen (ref), hex);
  snprintf (path, sizeof path, "%s/refs/%s", c->root, hex);
  json_error_t jerr;
  json_t *doc = json_load_file (path, 0, &jerr);
  const char *d = json_string_value (json_object_get (doc, "digest"));
  int rc = d != NULL && img_digest_valid (d) ? 0 : -1;
  if (rc == 0)
    snprintf (dg, SBX_IMAGE_DIGEST_MAX + 1, "%s", d);
  json_decref (doc);
  return rc;
}

/* The cached image of `ref` (by its digest when it has one), without the
 * registry. 0 found, -1 not. */
static int
cached (img_cache_t *c, const char *ref, const img_ref_t *p, img_t *out)
{
  char dg[SBX_IMAGE_DIGEST_MAX + 1];
  if (p->digest[0] != '\0')
    snprintf (dg, sizeof dg, "%s", p->digest);
  else if (lookup_ref (c, ref, dg) < 0)
    return -1;
  err_t ignored = ERR_INIT;
  int rc = read_record (c, dg, out, &ignored);
  err_release (&ignored);
  if (rc == 0)
    {
      snprintf (out->ref, sizeof out->ref, "%s", ref);
      touch_record (c, dg);
    }
  return rc;
}

int
img_record (img_cache_t *c, const char *ref, const char *digest, json_t *record, err_t *err)
{
  char path[PATH_MAX], hex[65];
  snprintf (path, sizeof path, "%s/manifests/%s", c->root, digest + 7);
  if (write_json (c, path, record, err) < 0)
    return -1;
  sha256_hex (ref, strlen (ref), hex);
  snprintf (path, sizeof path, "%s/refs/%s", c->root, hex);
  json_t *r = json_pack ("{s:s, s:s}", "ref", ref, "digest", digest);
  int rc = r != NULL ? write_json (c, path, r, err) : err_make (err, ENOMEM, "out of memory");
  json_decref (r);
  return rc;
}

const char *
img_cache_root (const img_cache_t *c)
{
  return c->root;
}

sbx_runtime_t *
img_cache_runtime (const img_cache_t *c)
{
  return c->rt;
}

const char *
img_cache_ca_file (const img_cache_t *c)
{
  return c->ca_file;
}

const img_google_t *
img_cache_google (const img_cache_t *c)
{
  return &c->google;
}

img_gate_t *
img_cache_gate (img_cache_t *c)
{
  return &c->gate;
}

snap_store_t *
img_cache_store (const img_cache_t *c)
{
  return c->store;
}

/* The cached image of `ref`, when it is there and (with `gen`) of that
 * version. */
static int
cached_gen (img_cache_t *c, const char *ref, const img_ref_t *p, const char *gen, img_t *out)
{
  if (cached (c, ref, p, out) < 0)
    return -1;
  if (gen == NULL || strcmp (out->gen, gen) == 0)
    return 0;
  img_release (out);
  return -1;
}

int
img_enter_claimed (img_cache_t *c, const char *ref, int64_t wait_ms, err_t *err)
{
  int64_t deadline = wait_ms > 0 ? img_gate_now_ms () + wait_ms : -wait_ms;
  /* Pulls of other images go on side by side; one of the same reference
   * is waited for, until this pull's own deadline. */
  if (img_gate_enter (&c->gate, deadline) != 0)
    return err_make (err, ETIMEDOUT, "image `%s`: a removal kept the cache busy past this call's deadline", ref);
  char key[SBX_IMAGE_REF_MAX + 8];
  snprintf (key, sizeof key, "ref:%s", ref);
  int rc = img_gate_claim (&c->gate, key, deadline);
  if (rc == 0)
    return 0;
  img_leave_claimed (c, NULL, NULL);
  return err_make (err, rc, "image `%s`: another pull of it ran past this call's deadline", ref);
}

void
img_leave_claimed (img_cache_t *c, const char *ref, const char *keep)
{
  if (ref != NULL)
    {
      char key[SBX_IMAGE_REF_MAX + 8];
      snprintf (key, sizeof key, "ref:%s", ref);
      img_gate_release (&c->gate, key);
    }
  /* The last pull out keeps the cache within its budget. */
  if (img_gate_leave_last (&c->gate))
    {
      img_evict_locked (c, c->budget, keep != NULL ? keep : "");
      img_gate_end (&c->gate);
    }
}

int
img_pull_gated (img_cache_t *c, const char *ref, const img_ref_t *p, const char *gen, bool reuse, img_pull_fn fn,
                void *ctx, const img_pull_opts_t *o, img_t *out, err_t *err)
{
  if (reuse && cached_gen (c, ref, p, gen, out) == 0)
    return 0;
  if (img_enter_claimed (c, ref, -o->deadline_mono_ms, err) < 0)
    return -1;
  /* Another launch may have pulled it while this one waited. */
  int rc = reuse && cached_gen (c, ref, p, gen, out) == 0 ? 1 : 0;
  if (rc == 0)
    {
      char dg[SBX_IMAGE_DIGEST_MAX + 1];
      rc = fn (c, ref, p, o, ctx, dg, err);
      if (rc == 0)
        {
          rc = read_record (c, dg, out, err);
          if (rc == 0)
            snprintf (out->ref, sizeof out->ref, "%s", ref);
        }
    }
  img_leave_claimed (c, ref, rc >= 0 ? out->digest : "");
  return rc < 0 ? -1 : 0;
}

static int
registry_pull (img_cache_t *c, const char *ref, const img_ref_t *p, const img_pull_opts_t *o, void *ctx, char *dg,
               err_t *err)
{
  (void) ctx;
  return img_pull_locked (c, ref, p, c->auth_file, c->insecure, o, dg, err);
}

int
img_pull (img_cache_t *c, const char *ref, const img_pull_opts_t *o, img_t *out, err_t *err)
{
  if (img_template_of (ref) != NULL)
    return img_template_pull (c, ref, o, out, err);
  img_ref_t p;
  if (img_ref_parse (ref, &p, err) < 0)
    return -1;
  bool reuse = !o->refresh || p.digest[0] != '\0';
  return img_pull_gated (c, ref, &p, NULL, reuse, registry_pull, NULL, o, out, err);
}

/* The manifest digests of `dir`'s record files, for a caller's walk. */
int
img_for_each_record (img_cache_t *c, int (*fn) (img_cache_t *c, const char *digest, void *ctx), void *ctx, err_t *err)
{
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/manifests", c->root);
  DIR *d = opendir (path);
  if (d == NULL)
    return err_make_sys (err, errno, "opendir `%s`", path);
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir (d)) != NULL)
    {
      if (strlen (e->d_name) != 64)
        continue;
      char dg[SBX_IMAGE_DIGEST_MAX + 1] = "sha256:";
      memcpy (dg + 7, e->d_name, 65); /* 64 characters, checked above, and the NUL */
      rc = fn (c, dg, ctx);
    }
  closedir (d);
  return rc;
}

typedef struct list_ctx_s
{
  img_t *v;
  size_t n, cap;
} list_ctx_t;

static int
add_listed (img_cache_t *c, const char *digest, void *ctx)
{
  list_ctx_t *l = ctx;
  if (l->n == l->cap)
    {
      size_t cap = l->cap ? l->cap * 2 : 8;
      img_t *v = realloc (l->v, cap * sizeof *v);
      if (v == NULL)
        return -1;
      l->v = v;
      l->cap = cap;
    }
  err_t ignored = ERR_INIT;
  if (read_record (c, digest, &l->v[l->n], &ignored) == 0)
    l->n++;
  err_release (&ignored);
  return 0;
}

int
img_list (img_cache_t *c, img_t **out, size_t *n, err_t *err)
{
  list_ctx_t l = {0};
  if (img_for_each_record (c, add_listed, &l, err) < 0)
    return -1;
  *out = l.v;
  *n = l.n;
  return 0;
}

/* Whether a live sandbox runs on `digest`. */
static bool
in_use (img_cache_t *c, const char *digest)
{
  cleanup_free sbx_info_t *infos = NULL;
  size_t n = 0;
  err_t ignored = ERR_INIT;
  if (sbx_list (c->rt, &infos, &n, &ignored) < 0)
    {
      err_release (&ignored);
      return true; /* unknown: keep it */
    }
  for (size_t i = 0; i < n; i++)
    if (strcmp (infos[i].image_digest, digest) == 0)
      return true;
  return false;
}

/* Marks the layers of `digest`'s record in `keep` (a json object). */
static int
mark_layers (img_cache_t *c, const char *digest, void *ctx)
{
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/manifests/%s", c->root, digest + 7);
  json_error_t jerr;
  json_t *doc = json_load_file (path, 0, &jerr), *layers = json_object_get (doc, "layers");
  for (size_t i = 0; i < json_array_size (layers); i++)
    {
      const char *hex = json_string_value (json_array_get (layers, i));
      if (hex != NULL)
        json_object_set_new (ctx, hex, json_true ());
    }
  const char *config = json_string_value (json_object_get (doc, "config"));
  if (config != NULL)
    json_object_set_new (ctx, config, json_true ());
  json_object_set_new (ctx, digest + 7, json_true ()); /* its manifest's blob */
  json_decref (doc);
  return 0;
}

/* Removes the blobs no record names. */
static void
sweep_blobs (img_cache_t *c, json_t *keep)
{
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/blobs", c->root);
  DIR *d = opendir (path);
  struct dirent *e;
  while (d != NULL && (e = readdir (d)) != NULL)
    if (strlen (e->d_name) == 64 && json_object_get (keep, e->d_name) == NULL)
      {
        char victim[PATH_MAX];
        snprintf (victim, sizeof victim, "%s/blobs/%s", c->root, e->d_name);
        unlink (victim);
      }
  if (d != NULL)
    closedir (d);
}

void
img_sweep_layers (img_cache_t *c)
{
  json_t *keep = json_object ();
  err_t ignored = ERR_INIT;
  if (keep == NULL || img_for_each_record (c, mark_layers, keep, &ignored) < 0)
    {
      err_release (&ignored);
      json_decref (keep);
      return;
    }
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/layers", c->root);
  DIR *d = opendir (path);
  struct dirent *e;
  while (d != NULL && (e = readdir (d)) != NULL)
    {
      size_t len = strlen (e->d_name);
      char hex[65];
      snprintf (hex, sizeof hex, "%.64s", e->d_name);
      bool layer = len == 64, size = len == 64 + 6 && strcmp (e->d_name + 64, ".bytes") == 0;
      if ((!layer && !size) || json_object_get (keep, hex) != NULL)
        continue;
      char victim[PATH_MAX];
      snprintf (victim, sizeof victim, "%s/layers/%s", c->root, e->d_name);
      if (layer)
        sbx_layer_remove (victim);
      else
        unlink (victim);
    }
  if (d != NULL)
    closedir (d);
  sweep_blobs (c, keep);
  json_decref (keep);
}

int
img_remove (img_cache_t *c, const char *ref, err_t *err)
{
  char dg[SBX_IMAGE_DIGEST_MAX + 1];
  img_ref_t p;
  if (img_digest_valid (ref))
    snprintf (dg, sizeof dg, "%s", ref);
  else if (img_ref_parse (ref, &p, err) < 0)
    return -1;
  else if (p.digest[0] != '\0')
    snprintf (dg, sizeof dg, "%s", p.digest);
  else if (lookup_ref (c, ref, dg) < 0)
    return err_make (err, ENOENT, "image `%s` is not cached", ref);
  /* Pulls in progress hold the cache: a removal waits for them a while. */
  if (img_gate_exclusive (&c->gate, img_gate_now_ms () + IMG_REMOVE_WAIT_S * 1000) != 0)
    return err_make (err, ETIMEDOUT, "image `%s`: pulls kept the cache busy for %d s", ref, IMG_REMOVE_WAIT_S);
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/manifests/%s", c->root, dg + 7);
  int rc = 0;
  if (access (path, F_OK) < 0)
    rc = err_make (err, ENOENT, "image `%s` is not cached", ref);
  else if (in_use (c, dg))
    rc = err_make (err, EBUSY, "image `%s` (%s) is in use by a live sandbox", ref, dg);
  else if (unlink (path) < 0)
    rc = err_make_sys (err, errno, "remove `%s`", path);
  if (rc == 0)
    img_sweep_layers (c);
  img_gate_end (&c->gate);
  return rc;
}
