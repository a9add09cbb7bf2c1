/* image/evict: the cache budget, SANDBOX_IMAGE_CACHE_MB (see image.h).
 *
 * After each pull, while the layers on disk pass the budget, the
 * image used least recently — its record's modification time, touched by
 * every launch and restore that finds it cached — that no live sandbox
 * runs on, that is not the image just pulled and that no launch used in
 * the last IMG_EVICT_GRACE_S (a launch that found it cached may not have
 * mounted its layers yet) loses its record; then
 * every layer no remaining record names is removed. A layer is measured
 * once (its blocks on disk, the walk bounded by the entries its unpack
 * allowed) and its size kept beside it as layers/<hex>.bytes; its blob as
 * fetched (blobs/<hex>, kept for templates) counts too. An image in
 * use is never evicted: while every image over the budget is in use the
 * cache stays over it, and says so in the log.
 *
 * Threading: called with the cache's gate held exclusively (no pull under
 * way, one eviction at a time). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "gateway/image/internal.h"

/* An image used more recently than this is not evicted. */
#define IMG_EVICT_GRACE_S 120

/* nftw's callback has no context: one walk at a time (the pull lock). */
static uint64_t walk_bytes;

static int
add_blocks (const char *path, const struct stat *st, int type, struct FTW *f)
{
  (void) path;
  (void) type;
  (void) f;
  walk_bytes += (uint64_t) st->st_blocks * 512;
  return 0;
}

/* The bytes on disk of layer `hex`: its .bytes file, else measured now and
 * kept there. */
static uint64_t
unpacked_bytes (const img_cache_t *c, const char *hex)
{
  char path[PATH_MAX], size_path[PATH_MAX];
  snprintf (path, sizeof path, "%s/layers/%s", img_cache_root (c), hex);
  snprintf (size_path, sizeof size_path, "%s/layers/%s.bytes", img_cache_root (c), hex);
  FILE *f = fopen (size_path, "re");
  uint64_t n = 0;
  if (f != NULL)
    {
      int got = fscanf (f, "%" SCNu64, &n);
      fclose (f);
      if (got == 1)
        return n;
    }
  walk_bytes = 0;
  if (nftw (path, add_blocks, 64, FTW_PHYS | FTW_MOUNT) != 0)
    return walk_bytes; /* gone or unreadable: what was seen */
  n = walk_bytes;
  f = fopen (size_path, "we");
  if (f != NULL)
    {
      fprintf (f, "%" PRIu64 "\n", n);
      fclose (f);
    }
  return n;
}

/* The bytes on disk of layer `hex`: unpacked, and its blob as fetched. */
static uint64_t
layer_bytes (const img_cache_t *c, const char *hex)
{
  char blob[PATH_MAX];
  snprintf (blob, sizeof blob, "%s/blobs/%s", img_cache_root (c), hex);
  struct stat st;
  uint64_t kept = stat (blob, &st) == 0 ? (uint64_t) st.st_blocks * 512 : 0;
  return unpacked_bytes (c, hex) + kept;
}

typedef struct entry_s
{
  char digest[SBX_IMAGE_DIGEST_MAX + 1];
  struct timespec used;
  json_t *layers; /* hex digests (a reference) */
  bool gone;
} entry_t;

typedef struct census_s
{
  entry_t *v;
  size_t n, cap;
} census_t;

static int
take_entry (img_cache_t *c, const char *digest, void *ctx)
{
  census_t *k = ctx;
  char path[PATH_MAX];
  snprintf (path, sizeof path, "%s/manifests/%s", img_cache_root (c), digest + 7);
  struct stat st;
  json_error_t jerr;
  json_t *doc = stat (path, &st) == 0 ? json_load_file (path, 0, &jerr) : NULL;
  if (doc == NULL)
    return 0;
  if (k->n == k->cap)
    {
      size_t cap = k->cap ? k->cap * 2 : 16;
      entry_t *v = realloc (k->v, cap * sizeof *v);
      if (v == NULL)
        {
          json_decref (doc);
          return -1;
        }
      k->v = v;
      k->cap = cap;
    }
  entry_t *e = &k->v[k->n++];
  snprintf (e->digest, sizeof e->digest, "%s", digest);
  e->used = st.st_mtim;
  e->layers = json_incref (json_object_get (doc, "layers"));
  e->gone = false;
  json_decref (doc);
  return 0;
}

/* Bytes of the distinct layers the records not gone name. */
static uint64_t
total_bytes (const img_cache_t *c, const census_t *k)
{
  json_t *seen = json_object ();
  uint64_t total = 0;
  for (size_t i = 0; seen != NULL && i < k->n; i++)
    for (size_t j = 0; !k->v[i].gone && j < json_array_size (k->v[i].layers); j++)
      {
        const char *hex = json_string_value (json_array_get (k->v[i].layers, j));
        if (hex == NULL || strlen (hex) != 64 || json_object_get (seen, hex) != NULL)
          continue;
        json_object_set_new (seen, hex, json_true ());
        total += layer_bytes (c, hex);
      }
  json_decref (seen);
  return total;
}

static bool
in_list (const sbx_info_t *infos, size_t n, const char *digest)
{
  for (size_t i = 0; i < n; i++)
    if (strcmp (infos[i].image_digest, digest) == 0)
      return true;
  return false;
}

/* The least recently used record that may go, or NULL. */
static entry_t *
oldest_evictable (census_t *k, const sbx_info_t *infos, size_t n_infos, const char *keep)
{
  entry_t *best = NULL;
  time_t recent = time (NULL) - IMG_EVICT_GRACE_S;
  for (size_t i = 0; i < k->n; i++)
    {
      entry_t *e = &k->v[i];
      if (e->gone || strcmp (e->digest, keep) == 0 || in_list (infos, n_infos, e->digest) || e->used.tv_sec > recent)
        continue;
      if (best == NULL || e->used.tv_sec < best->used.tv_sec
          || (e->used.tv_sec == best->used.tv_sec && e->used.tv_nsec < best->used.tv_nsec))
        best = e;
    }
  return best;
}

void
img_evict_locked (img_cache_t *c, uint64_t budget, const char *keep)
{
  if (budget == 0)
    return;
  census_t k = {0};
  cleanup_free sbx_info_t *infos = NULL;
  size_t n_infos = 0;
  cleanup_err err_t err = ERR_INIT;
  if (img_for_each_record (c, take_entry, &k, &err) < 0
      || sbx_list (img_cache_runtime (c), &infos, &n_infos, &err) < 0)
    {
      err_warn_release (&err, "image cache: cannot take stock for its budget; nothing evicted");
      goto out;
    }
  uint64_t total = total_bytes (c, &k);
  size_t evicted = 0;
  while (total > budget)
    {
      entry_t *e = oldest_evictable (&k, infos, n_infos, keep);
      if (e == NULL)
        {
          log_msg (SEV_WARNING,
                   "image cache: %" PRIu64 " MiB on disk, over SANDBOX_IMAGE_CACHE_MB (%" PRIu64
                   "): every image left is in use or was used in the last %d s",
                   total >> 20, budget >> 20, IMG_EVICT_GRACE_S);
          break;
        }
      char path[PATH_MAX];
      snprintf (path, sizeof path, "%s/manifests/%s", img_cache_root (c), e->digest + 7);
      if (unlink (path) < 0 && errno != ENOENT)
        {
          log_msg (SEV_WARNING, "image cache: cannot evict `%s`: %m", e->digest);
          break;
        }
      e->gone = true;
      evicted++;
      log_fields (SEV_INFO, json_pack ("{s:s}", "digest", e->digest), "image cache: evicted %s (least recently used)",
                  e->digest);
      total = total_bytes (c, &k);
    }
  if (evicted > 0)
    img_sweep_layers (c);
out:
  for (size_t i = 0; i < k.n; i++)
    json_decref (k.v[i].layers);
  free (k.v);
}
