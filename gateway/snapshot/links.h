/* snapshot/links: the export's table of hard links — which inode (device,
 * inode number) the export has already written, and under which path, so
 * that the next name of that inode becomes a hard-link entry.
 *
 * Compact by construction: a path is never stored whole. A directory that
 * holds (or is above) a linked file is a node (its parent node and its
 * name); a link is its (device, inode), its directory's node and its own
 * name; names live in one pool. A 3.8 KB path shared by 100 000 links is
 * stored once, not 100 000 times, and looking a link up is one hash probe.
 * Every byte the table holds counts against SNAP_EXPORT_LINK_TABLE_BYTES,
 * and it tracks at most SNAP_EXPORT_MAX_HARD_LINKS links: past either the
 * export fails (ENOSPC) rather than grows.
 *
 * State: per export; one thread. Node 0 is the layer's root.
 */
#ifndef SBX_GATEWAY_SNAPSHOT_LINKS_H
#define SBX_GATEWAY_SNAPSHOT_LINKS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* Most files with several links one export keeps track of. */
#define SNAP_EXPORT_MAX_HARD_LINKS 131072
/* Most memory the table of one export holds (its hash, records, directory
 * nodes and names, counted at their allocated capacity). */
#define SNAP_EXPORT_LINK_TABLE_BYTES ((size_t) 48 << 20)
/* What all exports' tables hold at once: four at their largest. Past it an
 * export fails RESOURCE_EXHAUSTED (retry later) rather than grow. */
#define SNAP_EXPORT_LINK_TOTAL_BYTES ((size_t) 192 << 20)

typedef struct link_rec_s
{
  dev_t dev;
  ino_t ino;
  uint32_t dir;  /* its directory's node */
  uint32_t name; /* offset of its name in the pool */
} link_rec_t;

typedef struct link_node_s
{
  uint32_t parent;
  uint32_t name;
} link_node_t;

typedef struct snap_links_s
{
  uint32_t *slots; /* open addressing: record index + 1, 0 free */
  size_t n_slots;
  link_rec_t *recs;
  size_t n_recs, cap_recs;
  link_node_t *nodes; /* [0] is the root */
  size_t n_nodes, cap_nodes;
  char *pool;
  size_t pool_len, pool_cap;
  size_t bytes; /* allocated, counted against SNAP_EXPORT_LINK_TABLE_BYTES */
} snap_links_t;

/* The record of (dev, ino), or NULL. */
const link_rec_t *snap_links_find (const snap_links_t *t, dev_t dev, ino_t ino);

/* A directory node: `name` (len bytes) under node `parent`. ENOSPC past the
 * table's budget, ENOMEM. */
int snap_links_add_dir (snap_links_t *t, uint32_t parent, const char *name, size_t len, uint32_t *out, err_t *err);

/* Remembers (dev, ino) as file `name` of directory node `dir`. ENOSPC past
 * SNAP_EXPORT_MAX_HARD_LINKS or the budget, ENOMEM. */
int snap_links_add (snap_links_t *t, dev_t dev, ino_t ino, uint32_t dir, const char *name, err_t *err);

/* The path of `rec` ("a/b/name") into buf (PATH_MAX + 1 bytes at least:
 * the path was shorter than PATH_MAX when added). */
void snap_links_path (const snap_links_t *t, const link_rec_t *rec, char *buf, size_t cap);

/* Frees everything; the table is empty again. Returns the bytes it held. */
size_t snap_links_free (snap_links_t *t);

#endif
