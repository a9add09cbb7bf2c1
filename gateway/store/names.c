/* store/names: the object names of snapshots, shared by every store (see
 * store.h). No state. */
#include "gateway/store/store.h"

#include <stdio.h>

char *
snap_object_name (const snap_store_t *store, const char *sandbox_id)
{
  char *name = NULL;
  if (asprintf (&name, "%s%s.tar", store->prefix, sandbox_id) < 0)
    return NULL;
  return name;
}
