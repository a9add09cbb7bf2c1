/* store: where persisted snapshots live — a local directory or Google
 * Cloud Storage — behind one streaming interface.
 *
 * Objects are named "<prefix><sandbox id>.tar" (prefix default
 * "sandbox-snapshots/"), the names existing deployments use. A writer takes
 * the snapshot as it is produced and makes the object visible only on
 * commit (never a half object under the real name); a reader streams an
 * object back. Neither holds a whole snapshot in memory.
 *
 * Threading: a store is shared by all threads (implementations guard their
 * own shared state, e.g. a token cache); a writer or reader belongs to the
 * thread that opened it.
 */
#ifndef SBX_GATEWAY_SNAP_STORE_H
#define SBX_GATEWAY_SNAP_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* One written version of an object: `gen` changes with every write (GCS:
 * the object's generation; local: inode and modification time), `mtime_ms`
 * is when that version was written (Unix ms). */
typedef struct snap_gen_s
{
  char gen[48];
  int64_t mtime_ms;
} snap_gen_t;

typedef struct snap_store_s snap_store_t;
typedef struct snap_writer_s snap_writer_t;
typedef struct snap_reader_s snap_reader_t;

typedef struct snap_store_ops_s
{
  /* Starts writing `object`. */
  int (*writer_open) (snap_store_t *store, const char *object, snap_writer_t **out, err_t *err);
  /* Appends bytes. */
  int (*writer_write) (snap_writer_t *w, const uint8_t *data, size_t len, err_t *err);
  /* Makes the object visible under its name and frees the writer (also on
   * failure). */
  int (*writer_commit) (snap_writer_t *w, err_t *err);
  /* Drops what was written and frees the writer. */
  void (*writer_abort) (snap_writer_t *w);
  /* Opens `object` for reading: ENOENT when there is none. */
  int (*reader_open) (snap_store_t *store, const char *object, snap_reader_t **out, err_t *err);
  /* Reads up to `cap` bytes: >0 bytes read, 0 at the end (after verifying
   * the object's checksum where the store keeps one: EBADMSG on mismatch),
   * -1 with *err. */
  ssize_t (*reader_read) (snap_reader_t *r, uint8_t *buf, size_t cap, err_t *err);
  void (*reader_close) (snap_reader_t *r);
  /* Deletes `object`: ENOENT when there is none. */
  int (*remove) (snap_store_t *store, const char *object, err_t *err);
  /* True (1) when `object` exists, 0 when not, -1 with *err. */
  int (*exists) (snap_store_t *store, const char *object, err_t *err);
  /* As exists, and fills *out with the version that exists (zeroed when
   * none). */
  int (*stat) (snap_store_t *store, const char *object, snap_gen_t *out, err_t *err);
  /* Calls `fn` with the name of each "directory" right under `dir` (an
   * object name prefix ending in '/'): the next component of the objects
   * named `dir`NAME/..., each once, at most `max` of them (E2BIG past it).
   * `fn` returning -1 stops the walk with its error. */
  int (*list_dirs) (snap_store_t *store, const char *dir, size_t max, int (*fn) (void *ctx, const char *name),
                    void *ctx, err_t *err);
  /* Makes every request under way, and every later one, fail within about
   * a second instead of waiting for the network or retrying: for a
   * shutdown whose grace has ended. An upload so failed is never committed.
   * Any thread. NULL when the store's operations are local (they end on
   * their own). */
  void (*cancel_all) (snap_store_t *store);
  void (*destroy) (snap_store_t *store);
} snap_store_ops_t;

struct snap_store_s
{
  const snap_store_ops_t *ops;
  const char *kind; /* "local" or "gcs" */
  char *prefix;     /* object name prefix */
};

/* The object name of a sandbox's snapshot (caller frees). */
char *snap_object_name (const snap_store_t *store, const char *sandbox_id);

#endif
