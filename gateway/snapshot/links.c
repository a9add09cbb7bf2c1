/* snapshot/links: the export's compact hard-link table (see links.h).
 * State: per export; one thread. */
#include "gateway/snapshot/links.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* What every export's table holds now (SNAP_EXPORT_LINK_TOTAL_BYTES). */
static _Atomic size_t all_tables_bytes;

/* Takes `bytes` more for table `t` (its total moves from t->bytes to
 * `bytes`) from the gateway-wide budget; 0, or -1 with *err. */
static int
charge (snap_links_t *t, size_t bytes, err_t *err)
{
  if (bytes <= t->bytes)
    return 0;
  size_t more = bytes - t->bytes;
  if (atomic_fetch_add (&all_tables_bytes, more) + more > SNAP_EXPORT_LINK_TOTAL_BYTES)
    {
      atomic_fetch_sub (&all_tables_bytes, more);
      return err_make (err, EAGAIN,
                       "the exports under way hold the gateway's hard-link budget (%zu MiB, "
                       "SNAP_EXPORT_LINK_TOTAL_BYTES); retry later",
                       (size_t) SNAP_EXPORT_LINK_TOTAL_BYTES >> 20);
    }
  return 0;
}

/* Gives back what charge took beyond `bytes` (an allocation that failed). */
static void
uncharge (snap_links_t *t, size_t bytes)
{
  if (bytes > t->bytes)
    atomic_fetch_sub (&all_tables_bytes, bytes - t->bytes);
}

static int
over_budget (err_t *err)
{
  return err_make (err, ENOSPC,
                   "the layer has too many files with several links: their table would exceed %zu MiB "
                   "(SNAP_EXPORT_LINK_TABLE_BYTES); the export stops",
                   SNAP_EXPORT_LINK_TABLE_BYTES >> 20);
}

/* Makes room for `need` elements of `elem` bytes in *p (capacity *cap),
 * doubling, within the table's budget. */
static int
grow (snap_links_t *t, void **p, size_t *cap, size_t need, size_t elem, err_t *err)
{
  if (need <= *cap)
    return 0;
  size_t c = *cap ? *cap : 64;
  while (c < need)
    c *= 2;
  size_t bytes = t->bytes - *cap * elem + c * elem;
  if (bytes > SNAP_EXPORT_LINK_TABLE_BYTES)
    return over_budget (err);
  if (charge (t, bytes, err) < 0)
    return -1;
  void *g = realloc (*p, c * elem);
  if (g == NULL)
    {
      uncharge (t, bytes);
      return err_make (err, ENOMEM, "export: out of memory (hard-link table)");
    }
  *p = g;
  *cap = c;
  t->bytes = bytes;
  return 0;
}

/* Copies `name` (len bytes) into the pool: its offset in *off. */
static int
pool_add (snap_links_t *t, const char *name, size_t len, uint32_t *off, err_t *err)
{
  if (grow (t, (void **) &t->pool, &t->pool_cap, t->pool_len + len + 1, 1, err) < 0)
    return -1;
  memcpy (t->pool + t->pool_len, name, len);
  t->pool[t->pool_len + len] = '\0';
  *off = (uint32_t) t->pool_len;
  t->pool_len += len + 1;
  return 0;
}

static size_t
hash_of (dev_t dev, ino_t ino)
{
  uint64_t h
      = (uint64_t) ino * 0x9E3779B97F4A7C15ull ^ ((uint64_t) dev + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
  return (size_t) (h ^ (h >> 29));
}

const link_rec_t *
snap_links_find (const snap_links_t *t, dev_t dev, ino_t ino)
{
  if (t->n_slots == 0)
    return NULL;
  size_t mask = t->n_slots - 1;
  for (size_t i = hash_of (dev, ino) & mask;; i = (i + 1) & mask)
    {
      uint32_t s = t->slots[i];
      if (s == 0)
        return NULL;
      const link_rec_t *r = &t->recs[s - 1];
      if (r->ino == ino && r->dev == dev)
        return r;
    }
}

/* Doubles the hash (load at most one half) and places every record again. */
static int
rehash (snap_links_t *t, err_t *err)
{
  size_t n = t->n_slots ? t->n_slots * 2 : 256;
  size_t bytes = t->bytes - t->n_slots * sizeof *t->slots + n * sizeof *t->slots;
  if (bytes > SNAP_EXPORT_LINK_TABLE_BYTES)
    return over_budget (err);
  if (charge (t, bytes, err) < 0)
    return -1;
  uint32_t *s = calloc (n, sizeof *s);
  if (s == NULL)
    {
      uncharge (t, bytes);
      return err_make (err, ENOMEM, "export: out of memory (hard-link table)");
    }
  for (size_t k = 0; k < t->n_recs; k++)
    {
      size_t i = hash_of (t->recs[k].dev, t->recs[k].ino) & (n - 1);
      while (s[i] != 0)
        i = (i + 1) & (n - 1);
      s[i] = (uint32_t) k + 1;
    }
  free (t->slots);
  t->slots = s;
  t->n_slots = n;
  t->bytes = bytes;
  return 0;
}

int
snap_links_add_dir (snap_links_t *t, uint32_t parent, const char *name, size_t len, uint32_t *out, err_t *err)
{
  if (t->n_nodes == 0)
    {
      if (grow (t, (void **) &t->nodes, &t->cap_nodes, 1, sizeof *t->nodes, err) < 0)
        return -1;
      t->nodes[t->n_nodes++] = (link_node_t){0, 0}; /* the root */
    }
  link_node_t n = {.parent = parent};
  if (grow (t, (void **) &t->nodes, &t->cap_nodes, t->n_nodes + 1, sizeof *t->nodes, err) < 0
      || pool_add (t, name, len, &n.name, err) < 0)
    return -1;
  t->nodes[t->n_nodes] = n;
  *out = (uint32_t) t->n_nodes++;
  return 0;
}

int
snap_links_add (snap_links_t *t, dev_t dev, ino_t ino, uint32_t dir, const char *name, err_t *err)
{
  if (t->n_recs >= SNAP_EXPORT_MAX_HARD_LINKS)
    return err_make (err, ENOSPC,
                     "the layer has more than %d files with several links (SNAP_EXPORT_MAX_HARD_LINKS): the export "
                     "cannot keep track of them and stops",
                     SNAP_EXPORT_MAX_HARD_LINKS);
  if ((t->n_recs + 1) * 2 > t->n_slots && rehash (t, err) < 0)
    return -1;
  link_rec_t r = {.dev = dev, .ino = ino, .dir = dir};
  if (grow (t, (void **) &t->recs, &t->cap_recs, t->n_recs + 1, sizeof *t->recs, err) < 0
      || pool_add (t, name, strlen (name), &r.name, err) < 0)
    return -1;
  t->recs[t->n_recs] = r;
  size_t mask = t->n_slots - 1, i = hash_of (dev, ino) & mask;
  while (t->slots[i] != 0)
    i = (i + 1) & mask;
  t->slots[i] = (uint32_t) ++t->n_recs;
  return 0;
}

void
snap_links_path (const snap_links_t *t, const link_rec_t *rec, char *buf, size_t cap)
{
  /* Built from its end: the name, then each directory up to the root. */
  size_t at = cap - 1;
  buf[at] = '\0';
  const char *name = t->pool + rec->name;
  for (uint32_t node = rec->dir;; node = t->nodes[node].parent)
    {
      size_t len = strlen (name);
      if (len + 1 > at)
        break; /* cannot happen: the path was shorter than PATH_MAX */
      at -= len;
      memcpy (buf + at, name, len);
      if (node == 0)
        break;
      buf[--at] = '/';
      name = t->pool + t->nodes[node].name;
    }
  memmove (buf, buf + at, cap - at);
}

size_t
snap_links_free (snap_links_t *t)
{
  size_t held = t->bytes;
  atomic_fetch_sub (&all_tables_bytes, held);
  free (t->slots);
  free (t->recs);
  free (t->nodes);
  free (t->pool);
  *t = (snap_links_t){0};
  return held;
}
