/* store/open: choosing and opening the snapshot store (see open.h). No
 * state. */
#include "gateway/store/open.h"

#include "common/log.h"
#include "gateway/store/gcs/gcs.h"
#include "gateway/store/local.h"

int
store_open (const store_choice_t *c, snap_store_t **out, err_t *err)
{
  int rc;
  if (c->gcs_bucket != NULL)
    {
      /* Every setting from the gateway's configuration table (config.c):
       * the variables are read there and nowhere else. */
      gcs_config_t g = {0};
      g.bucket = c->gcs_bucket;
      g.prefix = c->prefix;
      g.emulator_host = c->gcs_emulator;
      g.credentials_file = c->gcs_credentials;
      g.metadata_host = c->gcs_metadata_host;
      g.chunk_size = c->gcs_chunk_bytes;
      g.retry_budget_ms = c->gcs_retry_ms;
      rc = gcs_store_new (&g, out, err);
    }
  else
    rc = snap_store_local_new (c->local_dir, c->prefix, out, err);
  if (rc == 0)
    log_fields (SEV_INFO,
                json_pack ("{s:s, s:s}", "store", (*out)->kind, "where",
                           c->gcs_bucket != NULL ? c->gcs_bucket : c->local_dir),
                "snapshot store");
  return rc;
}
