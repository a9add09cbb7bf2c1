/* store/local: the snapshot store in a local directory, the embedded
 * default (see store.h for the interface).
 *
 * Threading: as store.h.
 */
#ifndef SBX_GATEWAY_STORE_LOCAL_H
#define SBX_GATEWAY_STORE_LOCAL_H

#include "gateway/store/store.h"

/* The local store: objects are files under `dir` (object names may contain
 * '/', which become directories). Written to a temporary name, fsynced and
 * renamed. */
int snap_store_local_new (const char *dir, const char *prefix, snap_store_t **out, err_t *err);

#endif
