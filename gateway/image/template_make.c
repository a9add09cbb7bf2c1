/* image/template_make: a template's creation (see image.h): the new layer
 * taken into the cache, the config and manifest made from the base
 * image's own blobs as pulled, every blob then oci-layout then index.json
 * written to the store, and the cache's record of it. The store side
 * (reading, pulling, listing, deleting) is template.c.
 *
 * Threading: any thread; a creation claims its template's reference in the
 * cache's gate (gate.h). */
#include <errno.h>
#include <fcntl.h>
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
#include "gateway/image/internal.h"

#define OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define OCI_CONFIG "application/vnd.oci.image.config.v1+json"
#define OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define OCI_LAYER_TAR "application/vnd.oci.image.layer.v1.tar"
/* Pieces of an upload. */
#define PIECE (1024 * 1024)

/* ---- the layout's documents ---------------------------------------------- */

static void
rfc3339_now (char *buf, size_t cap)
{
  time_t t = time (NULL);
  struct tm tm;
  gmtime_r (&t, &tm);
  strftime (buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A cached image's record (manifests/<hex>) as JSON. */
static int
load_record (img_cache_t *c, const char *digest, json_t **out, err_t *err)
{
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/manifests/%s", img_cache_root (c), digest + 7);
  json_error_t jerr;
  *out = json_load_file (path, 0, &jerr);
  return *out != NULL ? 0 : err_make (err, ENOENT, "image `%s` is not cached", digest);
}

/* The base image's record has what a template needs: every blob kept, and
 * the media types and sizes of its layers. */
static int
base_complete (img_cache_t *c, json_t *base, err_t *err)
{
  json_t *layers = json_object_get (base, "layers"), *media = json_object_get (base, "media");
  json_t *sizes = json_object_get (base, "sizes");
  const char *config = json_string_value (json_object_get (base, "config"));
  size_t n = json_array_size (layers);
  bool ok = config != NULL && json_array_size (media) == n && json_array_size (sizes) == n;
  for (size_t i = 0; ok && i <= n; i++)
    {
      const char *hex = i < n ? json_string_value (json_array_get (layers, i)) : config;
      char path[PATH_MAX];
      struct stat st;
      snprintf (path, sizeof path, "%s/blobs/%s", img_cache_root (c), hex != NULL ? hex : "-");
      ok = hex != NULL && strlen (hex) == 64 && stat (path, &st) == 0;
    }
  if (n + 1 > IMG_MAX_LAYERS)
    return err_make (err, EINVAL, "image `%s` has %zu layers: a template on it would pass the cap of %d",
                     json_string_value (json_object_get (base, "ref")) ?: "", n, IMG_MAX_LAYERS);
  return ok ? 0
            : err_make (err, EBUSY,
                        "image `%s` was cached without the blobs a template copies: remove it "
                        "(RemoveImage) and pull it again",
                        json_string_value (json_object_get (base, "ref")) ?: "");
}

/* The config of the template: the base's (its blob as pulled) with the new
 * layer's diff id (the layer is an uncompressed tar: its digest) added, or
 * a minimal one over the default image. */
static json_t *
make_config (img_cache_t *c, json_t *base, const char *hex, const char *sandbox_id, err_t *err)
{
  json_t *cfg = NULL;
  if (base != NULL)
    {
      char path[PATH_MAX];
      snprintf (path, sizeof path, "%s/blobs/%s", img_cache_root (c),
                json_string_value (json_object_get (base, "config")));
      json_error_t jerr;
      cfg = json_load_file (path, 0, &jerr);
    }
  else
    cfg = json_pack ("{s:s, s:s, s:{}, s:{s:s, s:[]}, s:[]}", "architecture", "amd64", "os", "linux", "config",
                     "rootfs", "type", "layers", "diff_ids", "history");
  json_t *diff_ids = json_object_get (json_object_get (cfg, "rootfs"), "diff_ids");
  if (!json_is_array (diff_ids))
    {
      json_decref (cfg);
      err_make (err, EINVAL, "the image's config has no rootfs.diff_ids");
      return NULL;
    }
  char id[72], created[32], by[128];
  snprintf (id, sizeof id, "sha256:%s", hex);
  rfc3339_now (created, sizeof created);
  snprintf (by, sizeof by, "sandbox-gateway CreateTemplate of sandbox %s", sandbox_id);
  json_array_append_new (diff_ids, json_string (id));
  json_object_set_new (cfg, "created", json_string (created));
  /* History, when the base keeps one, has an entry per layer. */
  json_t *history = json_object_get (cfg, "history");
  if (json_is_array (history))
    json_array_append_new (history, json_pack ("{s:s, s:s}", "created", created, "created_by", by));
  return cfg;
}

static json_t *
descriptor_of (const char *media, const char *hex, uint64_t size)
{
  char digest[72];
  snprintf (digest, sizeof digest, "sha256:%s", hex);
  return json_pack ("{s:s, s:s, s:I}", "mediaType", media, "digest", digest, "size", (json_int_t) size);
}

/* The manifest: the base's layers as pulled, then the new one. */
static json_t *
make_manifest (json_t *base, const char *base_digest, const char *hex, uint64_t bytes, const char *cfg_hex,
               size_t cfg_len, bool on_rootfs)
{
  json_t *layers = json_array ();
  json_t *hexes = json_object_get (base, "layers"), *media = json_object_get (base, "media");
  json_t *sizes = json_object_get (base, "sizes");
  for (size_t i = 0; i < json_array_size (hexes); i++)
    json_array_append_new (layers, descriptor_of (json_string_value (json_array_get (media, i)),
                                                  json_string_value (json_array_get (hexes, i)),
                                                  (uint64_t) json_integer_value (json_array_get (sizes, i))));
  json_array_append_new (layers, descriptor_of (OCI_LAYER_TAR, hex, bytes));
  char created[32];
  rfc3339_now (created, sizeof created);
  json_t *ann = json_pack ("{s:s}", "org.opencontainers.image.created", created);
  if (base != NULL)
    {
      json_object_set_new (ann, "org.opencontainers.image.base.name",
                           json_string (json_string_value (json_object_get (base, "ref")) ?: ""));
      json_object_set_new (ann, "org.opencontainers.image.base.digest", json_string (base_digest));
    }
  if (on_rootfs)
    json_object_set_new (ann, IMG_ANNOTATION_BASE, json_string ("rootfs"));
  return json_pack ("{s:i, s:s, s:o, s:o, s:o}", "schemaVersion", 2, "mediaType", OCI_MANIFEST, "config",
                    descriptor_of (OCI_CONFIG, cfg_hex, cfg_len), "layers", layers, "annotations", ann);
}

static json_t *
make_index (const char *name, const char *mdg, size_t mlen, json_t *base, const char *base_digest,
            const char *sandbox_id, uint64_t bytes, size_t n_layers)
{
  char created[32], size[32], count[16];
  snprintf (created, sizeof created, "%lld", (long long) now_ms ());
  snprintf (size, sizeof size, "%llu", (unsigned long long) bytes);
  snprintf (count, sizeof count, "%zu", n_layers);
  json_t *entry = json_pack ("{s:s, s:s, s:I, s:{s:s, s:s}, s:{s:s}}", "mediaType", OCI_MANIFEST, "digest", mdg,
                             "size", (json_int_t) mlen, "platform", "architecture", "amd64", "os", "linux",
                             "annotations", "org.opencontainers.image.ref.name", name);
  json_t *ann = json_pack (
      "{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", IMG_TPL_ANNOTATION ("name"), name, IMG_TPL_ANNOTATION ("base"),
      base != NULL ? json_string_value (json_object_get (base, "ref")) ?: "" : "", IMG_TPL_ANNOTATION ("base-digest"),
      base_digest, IMG_TPL_ANNOTATION ("sandbox"), sandbox_id, IMG_TPL_ANNOTATION ("created"), created,
      IMG_TPL_ANNOTATION ("bytes"), size, IMG_TPL_ANNOTATION ("layers"), count);
  return json_pack ("{s:i, s:s, s:[o], s:o}", "schemaVersion", 2, "mediaType", OCI_INDEX, "manifests", entry,
                    "annotations", ann);
}

/* ---- writing the store --------------------------------------------------- */

static int
upload_bytes (snap_store_t *st, const char *object, const char *data, size_t len, err_t *err)
{
  snap_writer_t *w = NULL;
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  if (st->ops->writer_open (st, object, &w, err) < 0)
    return -1;
  if (len > 0 && st->ops->writer_write (w, (const uint8_t *) data, len, err) < 0)
    {
      st->ops->writer_abort (w);
      return -1;
    }
  return st->ops->writer_commit (w, err);
}

/* Blob `hex` of the cache (blobs/<hex>) into template `name`'s layout. */
static int
upload_blob (img_cache_t *c, snap_store_t *st, const char *name, const char *hex, err_t *err)
{
  char path[PATH_MAX], digest[72];
  snprintf (path, sizeof path, "%s/blobs/%s", img_cache_root (c), hex);
  snprintf (digest, sizeof digest, "sha256:%s", hex);
  cleanup_free char *object = img_tpl_blob_object (st, name, digest);
  cleanup_close int fd = open (path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return err_make_sys (err, errno, "open `%s`", path);
  snap_writer_t *w = NULL;
  if (object == NULL || st->ops->writer_open (st, object, &w, err) < 0)
    return object == NULL ? err_make (err, ENOMEM, "out of memory") : -1;
  cleanup_free uint8_t *buf = malloc (PIECE);
  int rc = buf == NULL ? err_make (err, ENOMEM, "out of memory") : 0;
  while (rc == 0)
    {
      ssize_t n = TEMP_FAILURE_RETRY (read (fd, buf, PIECE));
      if (n <= 0)
        {
          rc = n < 0 ? err_make_sys (err, errno, "read `%s`", path) : 0;
          break;
        }
      rc = st->ops->writer_write (w, buf, (size_t) n, err);
    }
  if (rc < 0)
    {
      st->ops->writer_abort (w);
      return -1;
    }
  return st->ops->writer_commit (w, err);
}

/* The document `doc` as a blob: kept in the cache, its digest into hex. */
static int
keep_doc (img_cache_t *c, json_t *doc, char *hex, size_t *len, err_t *err)
{
  cleanup_free char *text = doc != NULL ? json_dumps (doc, JSON_COMPACT) : NULL;
  if (text == NULL)
    return err_make (err, ENOMEM, "out of memory");
  *len = strlen (text);
  unsigned char md[32];
  unsigned int n = 0;
  EVP_Digest (text, *len, md, &n, EVP_sha256 (), NULL);
  char digest[72] = "sha256:";
  for (int i = 0; i < 32; i++)
    sprintf (digest + 7 + 2 * i, "%02x", md[i]);
  snprintf (hex, 65, "%s", digest + 7);
  return img_keep_blob (c, digest, text, *len, err);
}

int
img_template_tmp (img_cache_t *c, char *path, err_t *err)
{
  snprintf (path, PATH_MAX, "%s/tmp/template.XXXXXX", img_cache_root (c));
  int fd = mkostemp (path, O_CLOEXEC);
  return fd >= 0 ? fd : err_make_sys (err, errno, "create `%s`", path);
}

/* The new layer's unpack into layers/<hex>, from its blob, on a thread of
 * its own while the blobs are stored. */
typedef struct unpack_s
{
  img_cache_t *c;
  const char *hex;
  int rc;
  err_t err;
} unpack_t;

static void *
unpack_main (void *arg)
{
  unpack_t *u = arg;
  char final[PATH_MAX], dir[PATH_MAX], kept[PATH_MAX];
  const char *root = img_cache_root (u->c);
  snprintf (final, sizeof final, "%s/layers/%s", root, u->hex);
  snprintf (dir, sizeof dir, "%s/tmp/%s.dir", root, u->hex);
  snprintf (kept, sizeof kept, "%s/blobs/%s", root, u->hex);
  struct stat st;
  if (stat (final, &st) == 0)
    return NULL; /* the same layer made before */
  cleanup_close int fd = open (kept, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  sbx_layer_remove (dir);
  err_t *err = &u->err;
  if (fd < 0)
    u->rc = err_make_sys (err, errno, "open `%s`", kept);
  else if (mkdir (dir, 0755) < 0)
    u->rc = err_make_sys (err, errno, "mkdir `%s`", dir);
  else if (sbx_unpack_layer (img_cache_runtime (u->c), fd, dir, IMG_UNPACK_MS, err) < 0)
    u->rc = err_wrap (err, "the template's layer");
  else if (rename (dir, final) < 0)
    u->rc = err_make_sys (err, errno, "rename `%s`", final);
  if (u->rc < 0)
    sbx_layer_remove (dir);
  return NULL;
}

/* What a template's creation builds and writes. */
typedef struct made_s
{
  const char *name, *base_digest, *hex, *sandbox_id;
  uint64_t bytes;
  json_t *base; /* the base's record, NULL: the default image */
  bool on_rootfs;
  char cfg_hex[65], man_hex[65];
  size_t cfg_len, man_len;
  json_t *manifest, *index;
} made_t;

/* Config and manifest made and kept; every blob, then oci-layout, stored. */
static int
store_blobs (img_cache_t *c, snap_store_t *st, made_t *m, err_t *err)
{
  json_t *cfg = make_config (c, m->base, m->hex, m->sandbox_id, err);
  if (cfg == NULL)
    return -1;
  int rc = keep_doc (c, cfg, m->cfg_hex, &m->cfg_len, err);
  json_decref (cfg);
  m->manifest = rc == 0
                    ? make_manifest (m->base, m->base_digest, m->hex, m->bytes, m->cfg_hex, m->cfg_len, m->on_rootfs)
                    : NULL;
  if (rc == 0)
    rc = keep_doc (c, m->manifest, m->man_hex, &m->man_len, err);
  json_t *layers = json_object_get (m->base, "layers");
  for (size_t i = 0; rc == 0 && i < json_array_size (layers); i++)
    rc = upload_blob (c, st, m->name, json_string_value (json_array_get (layers, i)), err);
  const char *own[] = {m->hex, m->cfg_hex, m->man_hex};
  for (size_t i = 0; rc == 0 && i < 3; i++)
    rc = upload_blob (c, st, m->name, own[i], err);
  static const char layout[] = "{\"imageLayoutVersion\":\"1.0.0\"}";
  cleanup_free char *lo = rc == 0 ? img_tpl_object (st, m->name, "oci-layout") : NULL;
  if (rc == 0)
    rc = upload_bytes (st, lo, layout, sizeof layout - 1, err);
  return rc;
}

/* index.json, last: from here on the template is there. */
static int
store_index (snap_store_t *st, made_t *m, err_t *err)
{
  char mdg[72];
  snprintf (mdg, sizeof mdg, "sha256:%s", m->man_hex);
  uint64_t total = m->bytes;
  json_t *sizes = json_object_get (m->base, "sizes");
  for (size_t i = 0; i < json_array_size (sizes); i++)
    total += (uint64_t) json_integer_value (json_array_get (sizes, i));
  m->index = make_index (m->name, mdg, m->man_len, m->base, m->base_digest, m->sandbox_id, total,
                         json_array_size (sizes) + 1);
  cleanup_free char *text = m->index != NULL ? json_dumps (m->index, JSON_COMPACT) : NULL;
  cleanup_free char *io = img_tpl_object (st, m->name, "index.json");
  return text == NULL || io == NULL ? err_make (err, ENOMEM, "out of memory")
                                    : upload_bytes (st, io, text, strlen (text), err);
}

static int store_claimed_layer (img_cache_t *c, snap_store_t *st, made_t *m, const char *layer_path, const char *kept,
                                err_t *err);

/* The layer kept as blobs/<hex>, unpacked into layers/ while every blob is
 * stored (side by side: the unpack reads from disk, the store writes), and
 * index.json stored once both are done. */
static int
store_layout (img_cache_t *c, snap_store_t *st, made_t *m, const char *layer_path, err_t *err)
{
  char kept[PATH_MAX], key[80];
  snprintf (kept, sizeof kept, "%s/blobs/%s", img_cache_root (c), m->hex);
  /* The layer is claimed as a pull claims one: two templates of the same
   * layer (or a pull of it) never unpack into one directory at once. */
  snprintf (key, sizeof key, "layer:%s", m->hex);
  int claimed = img_gate_claim (img_cache_gate (c), key, img_gate_now_ms () + IMG_PULL_MAX_MS);
  if (claimed != 0)
    return err_make (err, claimed, "the template's layer %s: another use of it ran too long", m->hex);
  int rc = store_claimed_layer (c, st, m, layer_path, kept, err);
  img_gate_release (img_cache_gate (c), key);
  return rc < 0 ? -1 : store_index (st, m, err);
}

/* store_layout with the new layer claimed. */
static int
store_claimed_layer (img_cache_t *c, snap_store_t *st, made_t *m, const char *layer_path, const char *kept,
                     err_t *err)
{
  if (rename (layer_path, kept) < 0)
    return err_make_sys (err, errno, "rename `%s`", kept);
  unpack_t u = {.c = c, .hex = m->hex, .err = ERR_INIT};
  pthread_t th;
  /* On the default image the layer is unpacked at each launch instead
   * (image.h): only its blob is kept. */
  bool threaded = !m->on_rootfs && pthread_create (&th, NULL, unpack_main, &u) == 0;
  if (!threaded && !m->on_rootfs)
    unpack_main (&u);
  int rc = store_blobs (c, st, m, err);
  if (threaded)
    pthread_join (th, NULL);
  if (rc == 0 && u.rc < 0)
    {
      *err = u.err;
      u.err = (err_t) ERR_INIT;
      rc = -1;
    }
  err_release (&u.err);
  return rc;
}

/* The cache's record of the template made: the base's defaults, its
 * layers and the new one, the store's version of it. */
static int
record_made (img_cache_t *c, snap_store_t *st, made_t *m, err_t *err)
{
  snap_gen_t gen;
  if (img_tpl_gen (st, m->name, &gen, err) <= 0)
    return err->status != 0 ? -1 : err_make (err, EIO, "template `%s`: gone right after it was stored", m->name);
  char ref[SBX_IMAGE_REF_MAX + 1], mdg[72];
  snprintf (ref, sizeof ref, IMG_TEMPLATE_PREFIX "%s", m->name);
  snprintf (mdg, sizeof mdg, "sha256:%s", m->man_hex);
  json_t *rec = m->base != NULL ? json_deep_copy (m->base)
                                : json_pack ("{s:[], s:[], s:[], s:s, s:s}", "layers", "media", "sizes", "env",
                                             "workdir", "", "user", "");
  if (rec == NULL)
    return err_make (err, ENOMEM, "out of memory");
  json_array_append_new (json_object_get (rec, "layers"), json_string (m->hex));
  json_array_append_new (json_object_get (rec, "media"), json_string (OCI_LAYER_TAR));
  json_array_append_new (json_object_get (rec, "sizes"), json_integer ((json_int_t) m->bytes));
  json_object_set_new (rec, "ref", json_string (ref));
  json_object_set_new (rec, "digest", json_string (mdg));
  json_object_set_new (rec, "config", json_string (m->cfg_hex));
  json_object_set_new (rec, "gen", json_string (gen.gen));
  json_object_set_new (rec, "template", json_true ());
  json_object_set_new (rec, "on_rootfs", json_boolean (m->on_rootfs));
  json_object_set (rec, "annotations", json_object_get (m->manifest, "annotations"));
  json_object_set_new (rec, "bytes",
                       json_integer (json_integer_value (json_object_get (rec, "bytes")) + (json_int_t) m->bytes));
  int rc = img_record (c, ref, mdg, rec, err);
  json_decref (rec);
  return rc;
}

static int
create_claimed (img_cache_t *c, snap_store_t *st, made_t *m, const char *layer_path, err_t *err)
{
  snap_gen_t gen;
  int rc = img_tpl_gen (st, m->name, &gen, err);
  if (rc != 0)
    return rc < 0 ? -1 : err_make (err, EEXIST, "template `%s` exists (DeleteTemplate removes it)", m->name);
  if (m->base_digest[0] != '\0'
      && (load_record (c, m->base_digest, &m->base, err) < 0 || base_complete (c, m->base, err) < 0))
    return -1;
  /* A sandbox on a template made on the default image has that template's
   * files in its own layer already: its template is made on the default
   * image too, of that one layer. */
  if (m->base != NULL && json_is_true (json_object_get (m->base, "on_rootfs")))
    {
      json_decref (m->base);
      m->base = NULL;
      m->base_digest = "";
    }
  m->on_rootfs = m->base == NULL;
  if (store_layout (c, st, m, layer_path, err) < 0)
    return -1;
  return record_made (c, st, m, err);
}

int
img_template_create (img_cache_t *c, const char *name, const char *base_digest, const char *layer_path,
                     uint64_t bytes, const char *hex, const char *sandbox_id, img_template_t *out, err_t *err)
{
  snap_store_t *st = img_tpl_store (c, err);
  int rc = st == NULL ? -1 : img_template_name_valid (name) ? 0 : img_tpl_bad_name (name, err);
  char ref[SBX_IMAGE_REF_MAX + 1];
  snprintf (ref, sizeof ref, IMG_TEMPLATE_PREFIX "%s", name);
  made_t m = {.name = name, .base_digest = base_digest, .hex = hex, .sandbox_id = sandbox_id, .bytes = bytes};
  if (rc == 0 && img_enter_claimed (c, ref, IMG_PULL_MAX_MS, err) == 0)
    {
      rc = create_claimed (c, st, &m, layer_path, err);
      img_leave_claimed (c, ref, rc == 0 ? "" : NULL);
    }
  else
    rc = -1;
  if (rc == 0)
    img_tpl_describe (m.index, name, out);
  unlink (layer_path); /* when not taken */
  json_decref (m.base);
  json_decref (m.manifest);
  json_decref (m.index);
  return rc;
}
