/* snapshot/expire: what ends a sandbox that expired (its idle TTL or its
 * most lifetime, runtime/lifetime.c) and is to be persisted first
 * (persist_on_expiry): its layer goes to the store as a PersistSnapshot
 * would put it, then the sandbox is deleted, so that a later Connect
 * restores it. A stale copy (snap_copy_stale) is not persisted, as at
 * shutdown. A persist that fails is logged (the sandbox's unsaved work is
 * lost) and the sandbox is deleted all the same: an expired sandbox never
 * lives on.
 *
 * Threading: runs on the runtime's idler thread (sbx_expire_fn), one
 * sandbox at a time; the export's freeze deadline
 * (SANDBOX_EXPORT_FREEZE_SECONDS) and the store's retry limits bound it.
 */
#ifndef SBX_GATEWAY_SNAPSHOT_EXPIRE_H
#define SBX_GATEWAY_SNAPSHOT_EXPIRE_H

#include "gateway/runtime/runtime.h"

/* The hook: ctx is the snap_store_t. */
void snap_expire (void *ctx, sbx_runtime_t *rt, const char *id, const char *why);

#endif
