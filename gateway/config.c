/* config: the gateway's configuration from the environment (see config.h):
 * loading the table (config_vars.c), then what the table cannot check —
 * addresses, pairs and maxima that go together, the uid pool, the
 * descriptors connections may hold, derived paths — the files it names,
 * and the runtime's view of it. Volumes are config_volumes.c's.
 * No state: everything lands in the caller's gw_config_t. */
#include "gateway/config.h"
#include "gateway/config_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/config.h"
#include "common/log.h"
#include "common/tls_files.h"

/* SANDBOX_PERSIST_ON_SHUTDOWN: a boolean, or unset: on when the operator
 * chose a store (a directory or a bucket), off with the default directory
 * under the state directory, which goes with the machine anyway. */
static int
parse_persist_on_shutdown (gw_config_t *c, err_t *err)
{
  if (c->persist_on_shutdown_text == NULL)
    {
      c->persist_on_shutdown = c->snapshot_dir != NULL || c->gcs_bucket != NULL;
      return 0;
    }
  if (cfg_parse_bool (c->persist_on_shutdown_text, &c->persist_on_shutdown) < 0)
    return err_make (err, EINVAL,
                     "SANDBOX_PERSIST_ON_SHUTDOWN: `%s` is not a boolean (true/false; unset: true when "
                     "SANDBOX_SNAPSHOT_DIR or CLOUD_RUN_SANDBOX_GCS_BUCKET is set)",
                     c->persist_on_shutdown_text);
  return 0;
}

/* SANDBOX_GATEWAY_NAME, checked, else the host name (in a StatefulSet, the
 * pod's stable name). */
static int
set_gateway_name (gw_config_t *c, err_t *err)
{
  if (c->gateway_name == NULL)
    {
      char host[GW_NAME_MAX + 2] = "";
      if (gethostname (host, sizeof host - 1) < 0)
        return err_make_sys (err, errno, "SANDBOX_GATEWAY_NAME is unset and the host name cannot be read");
      c->gateway_name = strdup (host);
      return c->gateway_name == NULL ? err_make (err, ENOMEM, "out of memory") : 0;
    }
  size_t n = strlen (c->gateway_name);
  if (n > GW_NAME_MAX)
    return err_make (err, EINVAL, "SANDBOX_GATEWAY_NAME: %zu characters, more than %d", n, GW_NAME_MAX);
  /* The value is not quoted back: it may not be text at all. */
  for (size_t i = 0; i < n; i++)
    {
      unsigned char ch = (unsigned char) c->gateway_name[i];
      if (ch <= ' ' || ch >= 0x7f)
        return err_make (err, EINVAL, "SANDBOX_GATEWAY_NAME: byte %zu of %zu is not printable ASCII (or is a space)",
                         i + 1, n);
    }
  return 0;
}

long
gw_default_max_sandboxes (long cap)
{
  /* An idle sandbox costs about 0.7 MiB (kernel memory mostly: its
   * namespaces, the holder's stack and tables; docs/runtime.md): a quarter
   * of the machine's memory per MiB keeps a full house of idle ones under a
   * fifth of it, the rest for what they run. */
  long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  long mib = pages > 0 && page > 0 ? (long) ((unsigned long long) pages * (unsigned long long) page >> 20) : 0;
  long n = mib / 4;
  /* The gateway holds GW_FDS_PER_SANDBOX descriptors per live sandbox
   * (its disk; slirp4netns' exit pipe with egress) under its open-file
   * hard limit, with room left for calls and streams. */
  struct rlimit nofile;
  if (getrlimit (RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_max != RLIM_INFINITY)
    {
      long fit = ((long) nofile.rlim_max - GW_FDS_RESERVED) / GW_FDS_PER_SANDBOX;
      if (n > fit)
        n = fit;
    }
  if (n < 16)
    n = 16;
  return n < cap ? n : cap;
}

/* `value` of `var` is host:port with a port in 0..65535. */
static int
check_listen (const char *var, const char *value, err_t *err)
{
  const char *colon = strrchr (value, ':');
  char *port_end = NULL;
  long port = colon != NULL ? strtol (colon + 1, &port_end, 10) : -1;
  if (colon == NULL || colon == value || port_end == colon + 1 || *port_end != '\0' || port < 0 || port > 65535)
    return err_make (err, EINVAL, "%s: `%s` is not host:port with a port in 0..65535", var, value);
  return 0;
}

/* The uid pool: SANDBOX_UID_SLOTS ranges (0: SANDBOX_MAX of them) from
 * SANDBOX_UID_BASE, all below the invalid uid (uid_t)-1; SANDBOX_MAX at 0
 * is sized from memory, at most the pool. Every live sandbox needs a range
 * of its own: SANDBOX_MAX past the pool is refused, naming both. */
static int
size_uid_pool (gw_config_t *c, err_t *err)
{
  if (!c->userns)
    {
      if (c->max_sandboxes == 0)
        c->max_sandboxes = gw_default_max_sandboxes (100000);
      return 0;
    }
  long fit = (4294967295L - c->uid_base) / c->uid_range;
  if (c->uid_slots > fit)
    return err_make (err, EINVAL,
                     "SANDBOX_UID_BASE %ld + SANDBOX_UID_SLOTS %ld ranges of SANDBOX_UID_RANGE %ld go past the last "
                     "uid; lower one of them",
                     c->uid_base, c->uid_slots, c->uid_range);
  if (c->max_sandboxes == 0)
    c->max_sandboxes = gw_default_max_sandboxes (c->uid_slots > 0 ? c->uid_slots : fit);
  if (c->uid_slots == 0 && c->max_sandboxes > fit)
    return err_make (err, EINVAL,
                     "SANDBOX_UID_BASE %ld + SANDBOX_MAX %ld ranges of SANDBOX_UID_RANGE %ld go past the last uid; "
                     "lower one of them",
                     c->uid_base, c->max_sandboxes, c->uid_range);
  if (c->uid_slots == 0)
    c->uid_slots = c->max_sandboxes;
  if (c->max_sandboxes > c->uid_slots)
    return err_make (err, EINVAL,
                     "SANDBOX_MAX %ld is more than the SANDBOX_UID_SLOTS %ld ranges of the uid pool: every live "
                     "sandbox needs one; raise SANDBOX_UID_SLOTS or lower SANDBOX_MAX",
                     c->max_sandboxes, c->uid_slots);
  if (c->uid_lock_dir[0] != '/')
    return err_make (err, EINVAL, "SANDBOX_UID_LOCK_DIR: `%s` is not an absolute path", c->uid_lock_dir);
  return 0;
}

/* Client connections hold a descriptor each: SANDBOX_MAX_CONNECTIONS is
 * lowered so that they, SANDBOX_MAX sandboxes' descriptors and the reserve
 * fit under the open-file hard limit (the gateway raises its soft limit
 * to it). Connections then never starve a launch or an exec. */
static void
fit_connections (gw_config_t *c)
{
  struct rlimit nofile;
  if (getrlimit (RLIMIT_NOFILE, &nofile) < 0 || nofile.rlim_max == RLIM_INFINITY)
    return;
  long room = (long) nofile.rlim_max - GW_FDS_RESERVED - c->max_sandboxes * GW_FDS_PER_SANDBOX;
  if (room < GW_MIN_CONNECTIONS)
    room = GW_MIN_CONNECTIONS;
  if (c->max_connections <= room)
    return;
  log_msg (SEV_WARNING,
           "SANDBOX_MAX_CONNECTIONS %ld lowered to %ld: the open-file limit %ld holds SANDBOX_MAX %ld sandboxes' "
           "descriptors and %d for calls and streams besides",
           c->max_connections, room, (long) nofile.rlim_max, c->max_sandboxes, GW_FDS_RESERVED);
  c->max_connections = room;
}

/* CPUs as text into millis: EINVAL naming `var` outside [0.01, 4096]. */
static int
parse_cpus (const char *var, const char *text, long *millis, err_t *err)
{
  char *end = NULL;
  double cpus = strtod (text, &end);
  if (end == text || *end != '\0' || !(cpus >= 0.01 && cpus <= 4096)) /* NaN fails too */
    return err_make (err, EINVAL, "%s: `%s` is not a number of CPUs in [0.01, 4096]", var, text);
  *millis = (long) (cpus * 1000 + 0.5);
  return 0;
}

/* The launch maxima: unset ones are the per-sandbox defaults, and none is
 * below its default (every launch that asks for nothing gets it). */
static int
resolve_maxima (gw_config_t *c, err_t *err)
{
  if (c->max_cpus != NULL && parse_cpus ("SANDBOX_MAX_CPUS", c->max_cpus, &c->max_cpu_millis, err) < 0)
    return -1;
  if (c->max_cpus == NULL)
    c->max_cpu_millis = c->cpu_millis; /* 0 with SANDBOX_CPUS unset: any */
  struct
  {
    const char *name, *def_name;
    long *max, def;
  } m[] = {
      {"SANDBOX_MAX_MEMORY_MB", "SANDBOX_MEMORY_MB", &c->max_memory_mb, c->memory_mb},
      {"SANDBOX_MAX_DISK_MB", "SANDBOX_DISK_MB", &c->max_disk_mb, c->disk_mb},
      {"SANDBOX_MAX_PIDS", "SANDBOX_PIDS_MAX", &c->max_pids, c->pids_max},
  };
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
    {
      if (*m[i].max == 0)
        *m[i].max = m[i].def;
      if (*m[i].max < m[i].def)
        return err_make (err, EINVAL, "%s %ld is below %s %ld", m[i].name, *m[i].max, m[i].def_name, m[i].def);
    }
  /* With SANDBOX_CPUS unset a launch that asks for nothing has no CPU
   * limit; SANDBOX_MAX_CPUS bounds only what a launch asks for. */
  if (c->max_cpu_millis > 0 && c->cpu_millis > 0 && c->max_cpu_millis < c->cpu_millis)
    return err_make (err, EINVAL, "SANDBOX_MAX_CPUS %s is below SANDBOX_CPUS %s", c->max_cpus, c->cpus);
  return 0;
}

int
gw_config_load (gw_config_t *c, err_t *err)
{
  memset (c, 0, sizeof *c);
  cfg_var_t vars[GW_CONFIG_N_VARS];
  gw_config_vars (c, vars);
  if (cfg_load (vars, GW_CONFIG_N_VARS, err) < 0)
    return -1;
  log_level_t level;
  if (log_parse_level (c->log_level, &level) < 0)
    return err_make (err, EINVAL, "SANDBOX_LOG_LEVEL: `%s` is not one of debug, info, warning, error", c->log_level);
  log_set_level (level);
  if (check_listen ("SANDBOX_LISTEN", c->listen, err) < 0
      || (c->health_listen != NULL && check_listen ("SANDBOX_HEALTH_LISTEN", c->health_listen, err) < 0))
    return -1;
  if ((c->tls_cert != NULL) != (c->tls_key != NULL))
    return err_make (err, EINVAL, "SANDBOX_TLS_CERT and SANDBOX_TLS_KEY must be set together");
  if (c->tls_client_ca != NULL && c->tls_cert == NULL)
    return err_make (err, EINVAL, "SANDBOX_TLS_CLIENT_CA needs SANDBOX_TLS_CERT and SANDBOX_TLS_KEY");
  if (c->cpus != NULL && parse_cpus ("SANDBOX_CPUS", c->cpus, &c->cpu_millis, err) < 0)
    return -1;
  if (resolve_maxima (c, err) < 0)
    return -1;
  if (c->max_idle_ttl == 0)
    c->max_idle_ttl = c->idle_ttl > GW_DEFAULT_MAX_IDLE_TTL ? c->idle_ttl : GW_DEFAULT_MAX_IDLE_TTL;
  if (c->max_idle_ttl < c->idle_ttl)
    return err_make (err, EINVAL, "SANDBOX_MAX_IDLE_TTL %ld is below SANDBOX_IDLE_TTL %ld", c->max_idle_ttl,
                     c->idle_ttl);
  if (c->state_dir[0] != '/' || c->rootfs[0] != '/')
    return err_make (err, EINVAL, "SANDBOX_STATE_DIR and SANDBOX_ROOTFS must be absolute paths");
  if (size_uid_pool (c, err) < 0 || sbx_pool_parse (c->warm_pool_text, &c->warm_pool, err) < 0)
    return -1;
  /* The layers' owner must be nobody a sandbox of this gateway runs as. */
  if (c->userns && c->image_uid + 65536 > c->uid_base && c->image_uid < c->uid_base + c->uid_slots * c->uid_range)
    return err_make (err, EINVAL,
                     "SANDBOX_IMAGE_UID %ld .. %ld overlaps the sandboxes' uid pool (SANDBOX_UID_BASE %ld, "
                     "SANDBOX_UID_SLOTS %ld x SANDBOX_UID_RANGE %ld)",
                     c->image_uid, c->image_uid + 65535, c->uid_base, c->uid_slots, c->uid_range);
  fit_connections (c);
  if (c->helper == NULL)
    {
      char self[4096];
      ssize_t n = readlink ("/proc/self/exe", self, sizeof self - 1);
      if (n <= 0)
        return err_make_sys (err, errno, "find this program's path");
      self[n] = '\0';
      *strrchr (self, '/') = '\0';
      if (asprintf (&c->helper, "%s/sandbox-helper", self) < 0)
        return err_make (err, ENOMEM, "out of memory");
    }
  /* Read before the default store's directory is filled in: persisting on
   * shutdown follows an explicit choice of store. */
  if (parse_persist_on_shutdown (c, err) < 0 || set_gateway_name (c, err) < 0)
    return -1;
  if (c->snapshot_dir == NULL && asprintf (&c->snapshot_dir, "%s/snapshots", c->state_dir) < 0)
    return err_make (err, ENOMEM, "out of memory");
  if (strstr (c->snapshot_prefix, "..") != NULL || c->snapshot_prefix[0] == '/')
    return err_make (err, EINVAL, "CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX: `%s` must be relative, without ..",
                     c->snapshot_prefix);
  /* What sandboxes must not see of the gateway's own files, should the image
   * (the lower layer) contain them: state, snapshots, keys, credentials. */
  size_t m = 0;
  const char *secret_paths[] = {c->state_dir, c->snapshot_dir, c->tls_key, c->gcs_credentials};
  static const char *const secret_names[]
      = {"SANDBOX_STATE_DIR", "SANDBOX_SNAPSHOT_DIR", "SANDBOX_TLS_KEY", "GOOGLE_APPLICATION_CREDENTIALS"};
  for (size_t i = 0; i < sizeof secret_paths / sizeof secret_paths[0]; i++)
    if (secret_paths[i] != NULL && secret_paths[i][0] == '/')
      {
        c->mask_names[m] = secret_names[i];
        c->masks[m++] = secret_paths[i];
      }
  c->masks[m] = NULL;

  /* sandbox-unpack lives beside sandbox-helper. */
  char *slash = strrchr (c->helper, '/');
  if (asprintf (&c->unpacker, "%.*ssandbox-unpack", slash != NULL ? (int) (slash - c->helper + 1) : 0, c->helper) < 0)
    return err_make (err, ENOMEM, "out of memory");
  return gw_config_parse_volumes (c, err);
}

int
gw_config_check_files (const gw_config_t *c, err_t *err)
{
  struct stat st;
  if (stat (c->rootfs, &st) < 0)
    return err_make_sys (err, errno, "SANDBOX_ROOTFS: `%s`", c->rootfs);
  if (!S_ISDIR (st.st_mode))
    return err_make (err, ENOTDIR, "SANDBOX_ROOTFS: `%s` is not a directory", c->rootfs);

  /* The state directory is made here if missing (its parent must exist),
   * so that a path that can never hold it is refused under its name. */
  if (mkdir (c->state_dir, 0700) < 0 && errno != EEXIST)
    return err_make_sys (err, errno, "SANDBOX_STATE_DIR: create `%s`", c->state_dir);
  if (stat (c->state_dir, &st) < 0)
    return err_make_sys (err, errno, "SANDBOX_STATE_DIR: `%s`", c->state_dir);
  if (!S_ISDIR (st.st_mode))
    return err_make (err, ENOTDIR, "SANDBOX_STATE_DIR: `%s` is not a directory", c->state_dir);
  if (access (c->state_dir, W_OK | X_OK) < 0)
    return err_make_sys (err, errno, "SANDBOX_STATE_DIR: `%s` is not writable", c->state_dir);

  tls_files_t tls = {
      .cert_var = "SANDBOX_TLS_CERT",
      .cert = c->tls_cert,
      .key_var = "SANDBOX_TLS_KEY",
      .key = c->tls_key,
      .ca_var = "SANDBOX_TLS_CLIENT_CA",
      .ca = c->tls_client_ca,
  };
  return tls_files_check (&tls, err);
}

void
gw_config_release (gw_config_t *c)
{
  gw_config_t zero = {0};
  cfg_var_t vars[GW_CONFIG_N_VARS];
  gw_config_vars (c, vars);
  for (size_t i = 0; i < GW_CONFIG_N_VARS; i++)
    if (vars[i].type == CFG_STRING)
      free (*(char **) vars[i].target);
  for (size_t i = 0; c->volumes[i] != NULL; i++)
    free (c->volumes[i]);
  free (c->unpacker);
  *c = zero;
}

void
gw_config_runtime (const gw_config_t *c, sbx_config_t *out)
{
  *out = (sbx_config_t){
      .state_dir = c->state_dir,
      .rootfs = c->rootfs,
      .helper = c->helper,
      .unpacker = c->unpacker,
      .cgroup_mount = "/sys/fs/cgroup",
      .cgroup_group = c->cgroup_group,
      .slirp4netns = c->slirp4netns,
      .disk_mb = c->disk_mb,
      .max_sandboxes = c->max_sandboxes,
      .pids_max = c->pids_max,
      .memory_mb = c->memory_mb,
      .cpu_millis = c->cpu_millis,
      .idle_ttl_seconds = c->idle_ttl,
      .freeze_max_seconds = c->freeze_max_seconds,
      .allow_egress = c->allow_egress,
      .volumes = (const char *const *) c->volumes,
      .snapshot_max_entries = c->snapshot_max_entries,
      .image_layer_max_mb = c->image_layer_max_mb,
      .masks = c->masks,
      .userns = c->userns,
      .uid_base = c->uid_base,
      .uid_range = c->uid_range,
      .uid_slots = c->uid_slots,
      .uid_lock_dir = c->uid_lock_dir,
      .max_processes = c->max_processes,
      .process_retain = c->process_retain,
      .process_buffer_bytes = c->process_buffer_bytes,
      .max_watches = c->max_watches,
      .exec_buffer_total_bytes = c->exec_buffer_total_mb * 1024 * 1024,
      .idle_counts_processes = c->idle_counts_processes,
      .image_uid = c->image_uid,
      .max_contexts = c->max_contexts,
      .max_contexts_total = c->max_contexts_total,
      .warm_pool = c->warm_pool,
      .max_memory_mb = c->max_memory_mb,
      .max_cpu_millis = c->max_cpu_millis,
      .max_disk_mb = c->max_disk_mb,
      .max_pids = c->max_pids,
      .max_idle_ttl_seconds = c->max_idle_ttl,
      .max_lifetime_seconds = c->max_lifetime,
      .persist_on_expiry = c->persist_on_shutdown,
  };
}
