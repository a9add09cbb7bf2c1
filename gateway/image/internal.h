/* image/internal: what cache.c and pull.c share. */
#ifndef SBX_GATEWAY_IMAGE_INTERNAL_H
#define SBX_GATEWAY_IMAGE_INTERNAL_H

#include <jansson.h>

#include "gateway/image/gate.h"
#include "gateway/image/image.h"
#include "gateway/image/ref.h"
#include "gateway/image/registry.h"

/* <state>/images, and the runtime that unpacks. */
const char *img_cache_root (const img_cache_t *c);
sbx_runtime_t *img_cache_runtime (const img_cache_t *c);
/* SANDBOX_REGISTRY_CA, or NULL. */
const char *img_cache_ca_file (const img_cache_t *c);
/* SANDBOX_REGISTRY_GOOGLE_HOSTS and where its tokens come from (see
 * img_cache_opts_t); `token` NULL: none. */
typedef struct img_google_s
{
  char *hosts;
  int (*token) (void *ctx, char **token, err_t *err);
  void (*put) (char *token);
  void *ctx;
} img_google_t;
const img_google_t *img_cache_google (const img_cache_t *c);
/* Where templates live, or NULL. */
snap_store_t *img_cache_store (const img_cache_t *c);
/* Who may touch the cache at once (gate.h). */
img_gate_t *img_cache_gate (img_cache_t *c);

/* Writes the record of manifest `digest` and ref -> digest. */
int img_record (img_cache_t *c, const char *ref, const char *digest, json_t *record, err_t *err);

/* Where a pull's blobs come from: `get` as img_reg_get (a registry), or a
 * template's layout in the store (template.c). `kind` "manifests" with a
 * tag or a digest, or "blobs" with a digest. */
typedef struct img_src_s
{
  int (*get) (void *ctx, const char *kind, const char *ref, const char *accept, uint64_t max, img_sink_fn sink,
              void *sink_ctx, char *content_type, err_t *err);
  void *ctx;
} img_src_t;

/* Keeps blob `digest` ("sha256:<hex>", already verified) as blobs/<hex>. */
int img_keep_blob (img_cache_t *c, const char *digest, const void *data, size_t len, err_t *err);

/* A pull from `src` of `p`'s tag or digest (the manifest, its config and
 * layers), the record (which may hold fields of the caller's) written
 * last; the manifest digest into dg. */
int img_pull_from (img_cache_t *c, const img_src_t *src, const char *ref, const img_ref_t *p,
                   const img_pull_opts_t *o, json_t *record, char *dg, err_t *err);

/* A pull, run inside the gate with `ref` claimed: the manifest digest into
 * dg once recorded. */
typedef int (*img_pull_fn) (img_cache_t *c, const char *ref, const img_ref_t *p, const img_pull_opts_t *o, void *ctx,
                            char *dg, err_t *err);

/* `ref` from the cache when `reuse` and its record is there (and, with
 * `gen`, of that version), else pulled by `fn` with the gate held and the
 * reference claimed (one pull of a reference at a time; the others wait
 * and find it cached), the cache kept within its budget after. */
int img_pull_gated (img_cache_t *c, const char *ref, const img_ref_t *p, const char *gen, bool reuse, img_pull_fn fn,
                    void *ctx, const img_pull_opts_t *o, img_t *out, err_t *err);

/* Enters the gate and claims `ref` (as a pull does), waiting at most
 * `wait_ms` (negative: until the monotonic ms -wait_ms). ETIMEDOUT. */
int img_enter_claimed (img_cache_t *c, const char *ref, int64_t wait_ms, err_t *err);
/* Releases `ref` (NULL: none claimed) and leaves the gate; the last one out
 * keeps the cache within its budget, never evicting `keep`'s digest. */
void img_leave_claimed (img_cache_t *c, const char *ref, const char *keep);

/* img_pull of `template:<name>`: from the store (template.c). */
int img_template_pull (img_cache_t *c, const char *ref, const img_pull_opts_t *o, img_t *out, err_t *err);

/* ---- shared by template.c and template_make.c ---- */

/* The annotations of a template's index.json. */
#define IMG_TPL_ANNOTATION(k) "io.sandbox-gateway.template." k
/* EINVAL naming `name` and the syntax of template names. */
int img_tpl_bad_name (const char *name, err_t *err);
/* The cache's store; NULL with ENOSYS when it has none. */
snap_store_t *img_tpl_store (img_cache_t *c, err_t *err);
/* "<prefix>templates/<name>/<rest>", and a blob's object in that layout
 * (`digest` checked by the caller); the caller frees, NULL out of memory. */
char *img_tpl_object (const snap_store_t *st, const char *name, const char *rest);
char *img_tpl_blob_object (const snap_store_t *st, const char *name, const char *digest);
/* Which version of template `name` the store has: 1 and *gen, 0 none. */
int img_tpl_gen (snap_store_t *st, const char *name, snap_gen_t *gen, err_t *err);
/* A template's description from its index.json. */
void img_tpl_describe (json_t *index, const char *name, img_template_t *t);

/* The pull itself, inside the gate with its reference claimed: every blob fetched,
 * verified, unpacked; the record written last. The manifest digest into
 * dg. */
int img_pull_locked (img_cache_t *c, const char *ref, const img_ref_t *p, const char *auth_file, const char *insecure,
                     const img_pull_opts_t *o, char *dg, err_t *err);

/* Calls fn for the manifest digest of every image record. */
int img_for_each_record (img_cache_t *c, int (*fn) (img_cache_t *c, const char *digest, void *ctx), void *ctx,
                         err_t *err);

/* Removes every layer (and its .bytes) and blob no image record names. */
void img_sweep_layers (img_cache_t *c);

/* With the gate held exclusively: evicts least recently used images no live
 * sandbox runs on (never `keep`) while the layers pass `budget` bytes
 * (0: none). See evict.c. */
void img_evict_locked (img_cache_t *c, uint64_t budget, const char *keep);

#endif
