/* snapshot/unpack: the snapshot tar importer of sandbox-unpack, as a library
 * (for the binary and the fuzzer).
 *
 * Reads a tar (uncompressed, gzip or zstd; any other compression is EINVAL
 * naming it) from `fd` and extracts it
 * into the current directory: relative paths only, no "..", nothing written
 * through symlinks, hard links only to files already unpacked, no device
 * nodes, fifos or sockets, at most `max_entries` entries, overlay's own
 * xattrs dropped, OCI whiteouts turned into overlay whiteouts. sandbox-unpack
 * runs it chrooted in the new layer as well.
 *
 * 0 ok; -1 with *err: EINVAL for a bad or hostile tar, ENOSPC when it does
 * not fit the disk quota, another errno for a local failure. Entries
 * extracted before a failure are left in place (the caller removes the
 * layer). Not thread-safe: it works relative to the process's cwd.
 *
 * `userxattr`: the layer is for an overlay mounted with `userxattr` (a
 * sandbox in its own user namespace), whose opaque mark is
 * user.overlay.opaque rather than trusted.overlay.opaque.
 */
#ifndef SBX_GATEWAY_SNAP_UNPACK_H
#define SBX_GATEWAY_SNAP_UNPACK_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* `max_bytes` > 0: at most that many bytes of file data in all (EFBIG
 * beyond, naming SANDBOX_IMAGE_LAYER_MAX_MB): an image layer has no disk
 * quota of its own, and 2 MiB of gzip can unpack to gigabytes. */
int snap_unpack (int fd, long max_entries, long long max_bytes, bool userxattr, err_t *err);

/* A tar path as the sandbox named it: every component stored escaped
 * (".wh..wh.u" before a name of the sandbox's own that begins with ".wh.",
 * the bare ".wh." included) loses its escape; runs of '/' become one.
 * Into `out` (cap bytes); -1 when it does not fit. */
int snap_unpack_unescape_path (const char *in, char *out, size_t cap);

#endif
