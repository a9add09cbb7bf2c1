/* gcs_cli: a small command-line front end of the GCS snapshot store
 * (gateway/gcs), for cross-checks against other clients:
 *
 *   gcs_cli [options] put OBJECT < data      upload stdin as OBJECT
 *   gcs_cli [options] get OBJECT > data      download OBJECT to stdout
 *   gcs_cli [options] rm OBJECT              delete OBJECT
 *   gcs_cli [options] exists OBJECT          exit 0 if it exists, 1 if not
 *
 * Options: --chunk-size BYTES, --retry-budget-ms MS, --endpoint URL. The
 * rest comes from the environment, as for the gateway:
 * CLOUD_RUN_SANDBOX_GCS_BUCKET, STORAGE_EMULATOR_HOST,
 * GOOGLE_APPLICATION_CREDENTIALS, GCE_METADATA_HOST. Object names are used
 * as given (no prefix). Exit status: 0 ok, 1 not found, 2 other failures.
 * Single-threaded.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/err.h"
#include "common/log.h"
#include "gateway/store/gcs/gcs.h"

static int
usage (void)
{
  fprintf (stderr, "usage: gcs_cli [--chunk-size BYTES] [--retry-budget-ms MS] [--endpoint URL] "
                   "put|get|rm|exists OBJECT\n");
  return 2;
}

static int
fail (err_t *err)
{
  fprintf (stderr, "gcs_cli: %s\n", err_msg (err));
  int code = err->status == ENOENT ? 1 : 2;
  err_release (err);
  return code;
}

static int
put (snap_store_t *st, const char *object, err_t *err)
{
  snap_writer_t *w = NULL;
  if (st->ops->writer_open (st, object, &w, err) < 0)
    return -1;
  static uint8_t buf[64 * 1024];
  for (;;)
    {
      ssize_t n = TEMP_FAILURE_RETRY (read (STDIN_FILENO, buf, sizeof buf));
      if (n < 0)
        {
          int e = errno;
          st->ops->writer_abort (w);
          return err_make_sys (err, e, "read stdin");
        }
      if (n == 0)
        break;
      if (st->ops->writer_write (w, buf, (size_t) n, err) < 0)
        {
          st->ops->writer_abort (w);
          return -1;
        }
    }
  return st->ops->writer_commit (w, err);
}

static int
get (snap_store_t *st, const char *object, err_t *err)
{
  snap_reader_t *r = NULL;
  if (st->ops->reader_open (st, object, &r, err) < 0)
    return -1;
  static uint8_t buf[64 * 1024];
  int rc = 0;
  for (;;)
    {
      ssize_t n = st->ops->reader_read (r, buf, sizeof buf, err);
      if (n <= 0)
        {
          rc = n < 0 ? -1 : 0;
          break;
        }
      for (ssize_t off = 0; off < n;)
        {
          ssize_t m = TEMP_FAILURE_RETRY (write (STDOUT_FILENO, buf + off, (size_t) (n - off)));
          if (m < 0)
            {
              rc = err_make_sys (err, errno, "write stdout");
              goto out;
            }
          off += m;
        }
    }
out:
  st->ops->reader_close (r);
  return rc;
}

static const char *
env_or_null (const char *name)
{
  const char *v = getenv (name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

/* This tool's settings come from the variables the gateway also reads
 * (its configuration table, gateway/config.c), empty counting as unset. */
static void
config_from_env (gcs_config_t *cfg)
{
  memset (cfg, 0, sizeof *cfg);
  cfg->bucket = env_or_null ("CLOUD_RUN_SANDBOX_GCS_BUCKET");
  cfg->prefix = env_or_null ("CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX");
  cfg->emulator_host = env_or_null ("STORAGE_EMULATOR_HOST");
  cfg->credentials_file = env_or_null ("GOOGLE_APPLICATION_CREDENTIALS");
  cfg->metadata_host = env_or_null ("GCE_METADATA_HOST");
}

int
main (int argc, char **argv)
{
  log_set_program ("gcs_cli");
  log_set_level (SEV_WARNING);
  gcs_config_t cfg;
  config_from_env (&cfg);
  int i = 1;
  for (; i + 1 < argc && strncmp (argv[i], "--", 2) == 0; i += 2)
    {
      if (strcmp (argv[i], "--chunk-size") == 0)
        cfg.chunk_size = strtoul (argv[i + 1], NULL, 10);
      else if (strcmp (argv[i], "--retry-budget-ms") == 0)
        cfg.retry_budget_ms = (unsigned) strtoul (argv[i + 1], NULL, 10);
      else if (strcmp (argv[i], "--endpoint") == 0)
        cfg.endpoint = argv[i + 1];
      else
        return usage ();
    }
  if (argc - i != 2)
    return usage ();
  const char *cmd = argv[i], *object = argv[i + 1];

  err_t err = ERR_INIT;
  snap_store_t *st = NULL;
  if (gcs_store_new (&cfg, &st, &err) < 0)
    return fail (&err);
  int rc;
  if (strcmp (cmd, "put") == 0)
    rc = put (st, object, &err);
  else if (strcmp (cmd, "get") == 0)
    rc = get (st, object, &err);
  else if (strcmp (cmd, "rm") == 0)
    rc = st->ops->remove (st, object, &err);
  else if (strcmp (cmd, "exists") == 0)
    {
      rc = st->ops->exists (st, object, &err);
      if (rc >= 0)
        {
          st->ops->destroy (st);
          return rc == 1 ? 0 : 1;
        }
    }
  else
    {
      st->ops->destroy (st);
      return usage ();
    }
  st->ops->destroy (st);
  return rc < 0 ? fail (&err) : 0;
}
