/* image/internal: what cache.c and pull.c share. */
#ifndef SBX_GATEWAY_IMAGE_INTERNAL_H
#define SBX_GATEWAY_IMAGE_INTERNAL_H

#include <jansson.h>

#include "gateway/image/gate.h"
#include "gateway/image/image.h"
#include "gateway/image/ref.h"

/* <state>/images, and the runtime that unpacks. */
const char *img_cache_root (const img_cache_t *c);
sbx_runtime_t *img_cache_runtime (const img_cache_t *c);
/* SANDBOX_REGISTRY_CA, or NULL. */
const char *img_cache_ca_file (const img_cache_t *c);
/* Who may touch the cache at once (gate.h). */
img_gate_t *img_cache_gate (img_cache_t *c);

/* Writes the record of manifest `digest` and ref -> digest. */
int img_record (img_cache_t *c, const char *ref, const char *digest, json_t *record, err_t *err);

/* The pull itself, inside the gate with its reference claimed: every blob fetched,
 * verified, unpacked; the record written last. The manifest digest into
 * dg. */
int img_pull_locked (img_cache_t *c, const char *ref, const img_ref_t *p, const char *auth_file, const char *insecure,
                     const img_pull_opts_t *o, char *dg, err_t *err);

/* Calls fn for the manifest digest of every image record. */
int img_for_each_record (img_cache_t *c, int (*fn) (img_cache_t *c, const char *digest, void *ctx), void *ctx,
                         err_t *err);

/* Removes every layer (and its .bytes) no image record names. */
void img_sweep_layers (img_cache_t *c);

/* With the gate held exclusively: evicts least recently used images no live
 * sandbox runs on (never `keep`) while the layers pass `budget` bytes
 * (0: none). See evict.c. */
void img_evict_locked (img_cache_t *c, uint64_t budget, const char *keep);

#endif
