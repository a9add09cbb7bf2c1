/* snapshot/record: what a stored snapshot ran on — the image reference and
 * manifest digest of its sandbox — kept beside it in the store as
 * "<object>.image", a small JSON object {"ref": …, "digest": …}, so that a
 * restore from the store (Connect, the shim's restore-on-miss, another
 * gateway of a scaled deployment) puts the snapshot back on the image it
 * was taken on, not on SANDBOX_ROOTFS. A snapshot of a sandbox on the
 * default image has no record. Read back, a record is checked like any
 * input from the store: at most SNAP_RECORD_MAX bytes, a valid digest, a
 * reference of at most SBX_IMAGE_REF_MAX bytes (EBADMSG otherwise). No
 * state; any thread.
 */
#ifndef SBX_GATEWAY_SNAPSHOT_RECORD_H
#define SBX_GATEWAY_SNAPSHOT_RECORD_H

#include "common/err.h"
#include "gateway/runtime/runtime.h"
#include "gateway/store/store.h"

/* The largest record read back. */
#define SNAP_RECORD_MAX 1024

typedef struct snap_record_s
{
  char ref[SBX_IMAGE_REF_MAX + 1];
  char digest[SBX_IMAGE_DIGEST_MAX + 1];
} snap_record_t;

/* Writes the record of snapshot `object` (the record of `info`'s image),
 * or removes a record left by an earlier snapshot when `info` runs on the
 * default image. */
int snap_record_put (snap_store_t *store, const char *object, const sbx_info_t *info, err_t *err);

/* Reads the record of `object` into *out: 1, or 0 when there is none. */
int snap_record_get (snap_store_t *store, const char *object, snap_record_t *out, err_t *err);

/* Removes the record of `object`, if any. */
int snap_record_remove (snap_store_t *store, const char *object, err_t *err);

#endif
