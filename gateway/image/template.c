/* image/template: templates (see image.h) — the store side: their names and
 * objects, pulled back from the store through the same pull as an image
 * from a registry (every blob verified against its digest), listed and
 * deleted. Their creation is template_make.c.
 *
 * Object names are built from a checked template name and checked digests
 * only. What the store returns is bounded (INDEX_MAX, the pull's caps) and
 * verified before use: a template written by another gateway is input
 * from outside like a registry's image.
 *
 * Threading: any thread; a template's creation, pull and deletion claim its
 * reference in the cache's gate (gate.h), so one of them runs at a time. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/image/internal.h"

#define TEMPLATES_DIR "templates/"
/* index.json, oci-layout: the most read of them. */
#define INDEX_MAX (64 * 1024)
/* Pieces of a download. */
#define PIECE (1024 * 1024)

const char *
img_template_of (const char *ref)
{
  size_t n = strlen (IMG_TEMPLATE_PREFIX);
  return ref != NULL && strncmp (ref, IMG_TEMPLATE_PREFIX, n) == 0 ? ref + n : NULL;
}

bool
img_template_name_valid (const char *name)
{
  size_t n = strlen (name);
  if (n == 0 || n > IMG_TEMPLATE_NAME_MAX || strstr (name, "..") != NULL)
    return false;
  for (size_t i = 0; i < n; i++)
    {
      char ch = name[i];
      bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
      if (!alnum && (i == 0 || (ch != '.' && ch != '_' && ch != '-')))
        return false;
    }
  return true;
}

int
img_tpl_bad_name (const char *name, err_t *err)
{
  return err_make (err, EINVAL,
                   "invalid template name `%.80s`: names match ^[a-z0-9][a-z0-9._-]*$, at most %d "
                   "characters",
                   name, IMG_TEMPLATE_NAME_MAX);
}

snap_store_t *
img_tpl_store (img_cache_t *c, err_t *err)
{
  snap_store_t *s = img_cache_store (c);
  if (s == NULL)
    err_make (err, ENOSYS, "templates need a snapshot store, and this gateway has none");
  return s;
}

/* "<prefix>templates/<name>/<rest>" (caller frees; NULL out of memory). */
char *
img_tpl_object (const snap_store_t *st, const char *name, const char *rest)
{
  char *o = NULL;
  return asprintf (&o, "%s" TEMPLATES_DIR "%s/%s", st->prefix, name, rest) < 0 ? NULL : o;
}

/* The object of blob `digest` (checked) in template `name`'s layout. */
char *
img_tpl_blob_object (const snap_store_t *st, const char *name, const char *digest)
{
  char rest[96];
  snprintf (rest, sizeof rest, "blobs/sha256/%s", digest + 7);
  return img_tpl_object (st, name, rest);
}

/* ---- reading the store --------------------------------------------------- */

static bool
past (const img_pull_opts_t *o)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  int64_t now = (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  return o != NULL && o->deadline_mono_ms > 0 && now > o->deadline_mono_ms;
}

/* Streams `object` (at most max bytes) to sink. */
static int
read_object (snap_store_t *st, const char *object, uint64_t max, img_sink_fn sink, void *ctx,
             const img_pull_opts_t *o, err_t *err)
{
  snap_reader_t *r = NULL;
  if (st->ops->reader_open (st, object, &r, err) < 0)
    return -1;
  cleanup_free uint8_t *buf = malloc (PIECE);
  uint64_t total = 0;
  int rc = buf == NULL ? err_make (err, ENOMEM, "out of memory") : 0;
  while (rc == 0)
    {
      if (o != NULL && o->cancelled != NULL && o->cancelled (o->cancel_ctx))
        rc = err_make (err, ECANCELED, "reading `%s`: cancelled", object);
      else if (past (o))
        rc = err_make (err, ETIMEDOUT, "reading `%s`: past the call's deadline", object);
      if (rc < 0)
        break;
      ssize_t n = st->ops->reader_read (r, buf, PIECE, err);
      if (n <= 0)
        {
          rc = n < 0 ? -1 : 0;
          break;
        }
      total += (uint64_t) n;
      if (total > max)
        rc = err_make (err, EINVAL, "`%s` is over %llu bytes", object, (unsigned long long) max);
      else if (sink (ctx, buf, (size_t) n) < 0)
        rc = err_make (err, EIO, "`%s`: its bytes could not be taken", object);
    }
  st->ops->reader_close (r);
  return rc;
}

typedef struct mem_s
{
  char *data;
  size_t len;
} mem_t;

static int
to_mem (void *ctx, const uint8_t *data, size_t len)
{
  mem_t *m = ctx;
  char *d = realloc (m->data, m->len + len + 1);
  if (d == NULL)
    return -1;
  memcpy (d + m->len, data, len);
  m->data = d;
  m->len += len;
  d[m->len] = '\0';
  return 0;
}

/* `object` as JSON (at most max bytes). */
static int
read_json (snap_store_t *st, const char *object, uint64_t max, json_t **out, err_t *err)
{
  mem_t m = {0};
  int rc = read_object (st, object, max, to_mem, &m, NULL, err);
  json_error_t jerr;
  *out = rc == 0 ? json_loadb (m.data != NULL ? m.data : "", m.len, 0, &jerr) : NULL;
  free (m.data);
  if (rc == 0 && !json_is_object (*out))
    {
      json_decref (*out);
      *out = NULL;
      return err_make (err, EINVAL, "`%s` is not a JSON object", object);
    }
  return rc;
}

/* A template's layout as a pull's source: a tag is its index.json, a
 * digest a blob. */
typedef struct store_src_s
{
  snap_store_t *store;
  const char *name;
  const img_pull_opts_t *o;
} store_src_t;

static int
store_get (void *ctx, const char *kind, const char *ref, const char *accept, uint64_t max, img_sink_fn sink,
           void *sink_ctx, char *content_type, err_t *err)
{
  (void) kind;
  (void) accept;
  store_src_t *s = ctx;
  content_type[0] = '\0';
  cleanup_free char *object = img_digest_valid (ref) ? img_tpl_blob_object (s->store, s->name, ref)
                                                     : img_tpl_object (s->store, s->name, "index.json");
  if (object == NULL)
    return err_make (err, ENOMEM, "out of memory");
  return read_object (s->store, object, max, sink, sink_ctx, s->o, err);
}

typedef struct pull_ctx_s
{
  const char *name, *gen;
} pull_ctx_t;

static int
pull_locked (img_cache_t *c, const char *ref, const img_ref_t *p, const img_pull_opts_t *o, void *ctx, char *dg,
             err_t *err)
{
  const pull_ctx_t *pc = ctx;
  store_src_t s = {.store = img_cache_store (c), .name = pc->name, .o = o};
  img_src_t src = {.get = store_get, .ctx = &s};
  json_t *record = json_pack ("{s:s, s:b}", "gen", pc->gen, "template", true);
  int rc = record != NULL ? img_pull_from (c, &src, ref, p, o, record, dg, err) : err_make (err, ENOMEM, "oom");
  json_decref (record);
  return rc;
}

/* Which version of template `name` the store has: 1 and *gen, 0 none. */
int
img_tpl_gen (snap_store_t *st, const char *name, snap_gen_t *gen, err_t *err)
{
  cleanup_free char *index = img_tpl_object (st, name, "index.json");
  if (index == NULL)
    return err_make (err, ENOMEM, "out of memory");
  return st->ops->stat (st, index, gen, err);
}

int
img_template_pull (img_cache_t *c, const char *ref, const img_pull_opts_t *o, img_t *out, err_t *err)
{
  const char *name = img_template_of (ref);
  snap_store_t *st = img_tpl_store (c, err);
  if (st == NULL)
    return -1;
  if (!img_template_name_valid (name))
    return img_tpl_bad_name (name, err);
  /* The store says which version is current: a template made again under
   * the name, or deleted, is never launched from an older copy. */
  snap_gen_t gen;
  int rc = img_tpl_gen (st, name, &gen, err);
  if (rc <= 0)
    return rc < 0 ? err_wrap (err, "template `%s`", name)
                  : err_make (err, ENOENT, "no template `%s` in the store (ListTemplates lists them)", name);
  img_ref_t p = {.tag = "index.json"};
  pull_ctx_t pc = {.name = name, .gen = gen.gen};
  return img_pull_gated (c, ref, &p, gen.gen, true, pull_locked, &pc, o, out, err);
}

/* A template's description from its index.json. */
void
img_tpl_describe (json_t *index, const char *name, img_template_t *t)
{
  memset (t, 0, sizeof *t);
  json_t *ann = json_object_get (index, "annotations");
  json_t *m = json_array_get (json_object_get (index, "manifests"), 0);
  snprintf (t->name, sizeof t->name, "%s", name);
  snprintf (t->digest, sizeof t->digest, "%s", json_string_value (json_object_get (m, "digest")) ?: "");
  snprintf (t->base, sizeof t->base, "%s",
            json_string_value (json_object_get (ann, IMG_TPL_ANNOTATION ("base"))) ?: "");
  snprintf (t->base_digest, sizeof t->base_digest, "%s",
            json_string_value (json_object_get (ann, IMG_TPL_ANNOTATION ("base-digest"))) ?: "");
  snprintf (t->sandbox_id, sizeof t->sandbox_id, "%s",
            json_string_value (json_object_get (ann, IMG_TPL_ANNOTATION ("sandbox"))) ?: "");
  const char *v = json_string_value (json_object_get (ann, IMG_TPL_ANNOTATION ("created")));
  t->created_ms = v != NULL ? strtoll (v, NULL, 10) : 0;
  v = json_string_value (json_object_get (ann, IMG_TPL_ANNOTATION ("bytes")));
  t->bytes = v != NULL ? strtoull (v, NULL, 10) : 0;
  v = json_string_value (json_object_get (ann, IMG_TPL_ANNOTATION ("layers")));
  t->n_layers = v != NULL ? (unsigned) strtoul (v, NULL, 10) : 0;
}

/* ---- listing and deleting ------------------------------------------------ */

static int
add_name (void *ctx, const char *name)
{
  if (img_template_name_valid (name))
    json_array_append_new (ctx, json_string (name));
  return 0;
}

int
img_template_list (img_cache_t *c, img_template_t **out, size_t *n, err_t *err)
{
  *out = NULL;
  *n = 0;
  snap_store_t *st = img_tpl_store (c, err);
  cleanup_free char *dir = NULL;
  if (st == NULL || asprintf (&dir, "%s" TEMPLATES_DIR, st->prefix) < 0)
    return st == NULL ? -1 : err_make (err, ENOMEM, "out of memory");
  json_t *names = json_array ();
  int rc = st->ops->list_dirs (st, dir, IMG_MAX_TEMPLATES, add_name, names, err);
  img_template_t *v = rc == 0 ? calloc (json_array_size (names) + 1, sizeof *v) : NULL;
  if (rc == 0 && v == NULL)
    rc = err_make (err, ENOMEM, "out of memory");
  for (size_t i = 0; rc == 0 && i < json_array_size (names); i++)
    {
      const char *name = json_string_value (json_array_get (names, i));
      cleanup_free char *io = img_tpl_object (st, name, "index.json");
      json_t *index = NULL;
      err_t skip = ERR_INIT;
      /* Half made (no index.json yet), being deleted, or unreadable: not
       * a template to launch from. */
      if (io != NULL && read_json (st, io, INDEX_MAX, &index, &skip) == 0)
        img_tpl_describe (index, name, &v[(*n)++]);
      err_release (&skip);
      json_decref (index);
    }
  json_decref (names);
  if (rc < 0)
    {
      free (v);
      *n = 0;
      return -1;
    }
  *out = v;
  return 0;
}

/* Removes `object` of the layout, ignoring one already gone. */
static void
remove_quietly (snap_store_t *st, char *object)
{
  err_t e = ERR_INIT;
  if (object != NULL && st->ops->remove (st, object, &e) < 0 && e.status != ENOENT)
    err_warn_release (&e, "delete a template's `%s`", object);
  err_release (&e);
  free (object);
}

static int
delete_claimed (snap_store_t *st, const char *name, err_t *err)
{
  cleanup_free char *io = img_tpl_object (st, name, "index.json");
  json_t *index = NULL, *manifest = NULL;
  if (io == NULL)
    return err_make (err, ENOMEM, "out of memory");
  if (read_json (st, io, INDEX_MAX, &index, err) < 0)
    return err->status == ENOENT ? (err_release (err), err_make (err, ENOENT, "no template `%s`", name)) : -1;
  const char *mdg
      = json_string_value (json_object_get (json_array_get (json_object_get (index, "manifests"), 0), "digest"));
  cleanup_free char *mo = mdg != NULL && img_digest_valid (mdg) ? img_tpl_blob_object (st, name, mdg) : NULL;
  err_t ignored = ERR_INIT;
  if (mo != NULL)
    read_json (st, mo, IMG_MANIFEST_MAX, &manifest, &ignored);
  err_release (&ignored);
  /* index.json first: from here on the template is gone. */
  int rc = st->ops->remove (st, io, err);
  if (rc == 0)
    {
      remove_quietly (st, img_tpl_object (st, name, "oci-layout"));
      json_t *layers = json_object_get (manifest, "layers");
      for (size_t i = 0; i <= json_array_size (layers); i++)
        {
          json_t *d
              = i < json_array_size (layers) ? json_array_get (layers, i) : json_object_get (manifest, "config");
          const char *dg = json_string_value (json_object_get (d, "digest"));
          if (dg != NULL && img_digest_valid (dg))
            remove_quietly (st, img_tpl_blob_object (st, name, dg));
        }
      if (mo != NULL)
        remove_quietly (st, strdup (mo));
    }
  json_decref (index);
  json_decref (manifest);
  return rc;
}

int
img_template_delete (img_cache_t *c, const char *name, err_t *err)
{
  snap_store_t *st = img_tpl_store (c, err);
  if (st == NULL)
    return -1;
  if (!img_template_name_valid (name))
    return img_tpl_bad_name (name, err);
  char ref[SBX_IMAGE_REF_MAX + 1];
  snprintf (ref, sizeof ref, IMG_TEMPLATE_PREFIX "%s", name);
  if (img_enter_claimed (c, ref, IMG_REMOVE_WAIT_S * 1000, err) < 0)
    return -1;
  int rc = delete_claimed (st, name, err);
  img_leave_claimed (c, ref, NULL);
  /* Its copy in this cache goes too, unless a sandbox runs on it (then
   * the budget's eviction takes it later). */
  err_t ignored = ERR_INIT;
  if (rc == 0)
    img_remove (c, ref, &ignored);
  err_release (&ignored);
  return rc;
}

int
img_top_layer (img_cache_t *c, const img_t *img, int *fd, err_t *err)
{
  const char *top = img->layers != NULL ? img->layers : "";
  const char *colon = strchr (top, ':');
  size_t len = colon != NULL ? (size_t) (colon - top) : strlen (top);
  if (len < 64)
    return err_make (err, EINVAL, "image `%s` has no layer", img->ref);
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/blobs/%.64s", img_cache_root (c), top + len - 64);
  *fd = open (path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  return *fd >= 0 ? 0 : err_make_sys (err, errno, "template `%s`: open its layer `%s`", img->ref, path);
}
