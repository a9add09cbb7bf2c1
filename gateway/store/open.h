/* store/open: the choice of the snapshot store — Google Cloud Storage when
 * a bucket is configured, else the local directory (the embedded default).
 *
 * Threading: start-up only.
 */
#ifndef SBX_GATEWAY_STORE_OPEN_H
#define SBX_GATEWAY_STORE_OPEN_H

#include <stddef.h>

#include "common/err.h"
#include "gateway/store/store.h"

typedef struct store_choice_s
{
  const char *local_dir;    /* SANDBOX_SNAPSHOT_DIR */
  const char *prefix;       /* CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX */
  const char *gcs_bucket;   /* NULL: the local store */
  const char *gcs_emulator; /* STORAGE_EMULATOR_HOST */
  const char *gcs_credentials;
  const char *gcs_metadata_host;
  size_t gcs_chunk_bytes;
  unsigned gcs_retry_ms;
} store_choice_t;

/* Opens the chosen store and logs which it is. Destroy with
 * (*out)->ops->destroy. */
int store_open (const store_choice_t *choice, snap_store_t **out, err_t *err);

#endif
