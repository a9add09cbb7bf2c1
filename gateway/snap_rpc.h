/* snap_rpc: handlers of the snapshot methods (see snap_rpc.c). */
#ifndef SBX_GATEWAY_SNAP_RPC_H
#define SBX_GATEWAY_SNAP_RPC_H

#include <stdbool.h>

#include "common/rpc.h"
#include "gateway/sbx_runtime.h"
#include "gateway/snap_store.h"

/* Sets the runtime and the store (both borrowed for the program's life). */
void snap_rpc_init (sbx_runtime_t *rt, snap_store_t *store);

int snap_rpc_restore (rpc_call_t *call, void *user, err_t *err);
int snap_rpc_export (rpc_call_t *call, void *user, err_t *err);
int snap_rpc_persist (rpc_call_t *call, void *user, err_t *err);
int snap_rpc_connect (rpc_call_t *call, void *user, err_t *err);

/* "local" or "gcs". */
const char *snap_rpc_store_kind (void);

/* Deletes the stored snapshot of sandbox `id` (a valid id); *deleted says
 * whether there was one. */
int snap_rpc_delete_snapshot (const char *id, bool *deleted, err_t *err);

#endif
