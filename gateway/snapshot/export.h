/* snapshot/export: a sandbox's writable layer as a tar stream (an OCI layer).
 *
 * Walks the overlay's upper directory with openat(2) and O_NOFOLLOW only —
 * never following a link, never leaving the tree, so what a sandbox plants
 * in its layer (symlinks, hard links, swapped directories) cannot make the
 * export read anything outside it — and writes a POSIX pax tar with
 * libarchive: overlay whiteouts (0:0 character devices) become OCI
 * whiteouts (".wh.NAME"), opaque directories get ".wh..wh..opq"; modes,
 * owners, times, symlinks, hard links inside the tree, empty directories and
 * extended attributes other than overlay's own are kept. FIFOs and sockets
 * cannot be restored and are left out.
 *
 * The stream goes to a sink in chunks of at most `chunk` bytes as it is
 * produced, with its SHA-256 computed on the way (unless asked not to):
 * memory stays flat whatever the layer's size. A sink that passes the bytes
 * on without copying them may keep them past its return (snap_export_hold)
 * and give them back later from any thread (snap_export_release); the
 * export reuses a buffer only once it is given back.
 *
 * Holes cost no bytes and almost no time: a file's data regions are found
 * with SEEK_DATA/SEEK_HOLE and written as a pax sparse entry; a hole after
 * the last region is free, one between regions costs a call per 2 GiB.
 * Every loop checks whether the export was told to stop. Hard links are
 * tracked in a compact table of bounded size (links.h).
 *
 * Threading: no shared state; one export per calling thread. Hold and
 * release may be called from any thread.
 */
#ifndef SBX_GATEWAY_SNAP_EXPORT_H
#define SBX_GATEWAY_SNAP_EXPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef enum snap_compression_e
{
  SNAP_COMPRESSION_NONE = 0,
  SNAP_COMPRESSION_GZIP = 1,
  SNAP_COMPRESSION_ZSTD = 2,
} snap_compression_t;

/* Receives the next piece of the stream. -1 with *err stops the export. */
typedef int (*snap_sink_fn) (void *ctx, const uint8_t *data, size_t len, err_t *err);

typedef struct snap_export_result_s
{
  uint64_t total_bytes;
  char sha256[65]; /* lowercase hex */
  uint64_t entries;
} snap_export_result_t;

/* A sandbox's layer as the export reads it. */
typedef struct snap_layer_s
{
  int upper_fd; /* the overlay's upper directory */
  /* Owners as the sandbox sees them: a host uid or gid in [id_base,
   * id_base + id_range) is written as its offset (the sandbox's root, host
   * uid id_base, is 0 in the tar); 0 stays 0 (whiteouts overlay makes as
   * the mounter); any other id, which no process of the sandbox can hold,
   * becomes 65534 (nobody). id_range 0: ids are written as they are. */
  uint32_t id_base, id_range;
  bool userxattr; /* overlay mounted with `userxattr`: its marks are user.overlay.* */
} snap_layer_t;

typedef struct snap_export_opts_s
{
  snap_compression_t compression;
  /* No SHA-256 of the stream (res->sha256 stays empty): for a consumer
   * that does not check it, the hash (about 2 GB/s per core) is then off
   * the stream's path. */
  bool skip_digest;
  /* Set from another thread to stop an export that waits for buffers its
   * sink still holds (a consumer that stopped taking bytes); may be NULL. */
  const atomic_bool *abort;
  /* Asked now and then from the export's own thread, between entries and
   * inside every loop (also those that send nothing, such as skipping a
   * hole): true stops the export (ECANCELED). May be NULL. */
  bool (*cancelled) (void *ctx);
  void *cancelled_ctx;
} snap_export_opts_t;

/* Streams the layer's tree to `sink`. */
int snap_export (const snap_layer_t *layer, const snap_export_opts_t *opts, size_t chunk, snap_sink_fn sink,
                 void *ctx, snap_export_result_t *res, err_t *err);

/* A sink keeps the bytes it was handed (`data` as given to it, the start
 * of its piece) past its return; each hold is ended by one release. */
void snap_export_hold (const uint8_t *data);
void snap_export_release (const uint8_t *data);

#endif
