/* config: the gateway's configuration from the environment (see config.h).
 * No state: everything lands in the caller's gw_config_t. */
#include "gateway/config.h"

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

static const char usage[] = "Usage: sandbox-gateway [--help]\n\n"
                            "Serves sandbox.v1.Sandbox (isolated Linux sandboxes: launch, exec with streamed\n"
                            "output, snapshots), grpc.health.v1.Health and gRPC server reflection.\n"
                            "Configuration comes from the environment only.";

#define N_VARS 67

/* The table of variables, with targets in *c. */
static void
vars_of (gw_config_t *c, cfg_var_t vars[N_VARS])
{
  const cfg_var_t table[] = {
      {"SANDBOX_LISTEN", CFG_STRING, "127.0.0.1:50051",
       "address the gRPC server listens on (host:port; port 0 picks one)", 0, 0, &c->listen, NULL, false},
      {"CLOUD_RUN_SANDBOX_GATEWAY_SECRET", CFG_STRING, NULL,
       "bearer secret every sandbox.v1.Sandbox call must present; unset: every call fails UNAVAILABLE", 0, 0,
       &c->secret, NULL, true},
      {"SANDBOX_LOG_LEVEL", CFG_STRING, "info", "lowest log severity written: debug, info, warning or error", 0, 0,
       &c->log_level, NULL, false},
      {"SANDBOX_MAX_MESSAGE_MB", CFG_INT, "16", "largest gRPC message accepted or sent, in MiB", 1, 1024,
       &c->max_message_mb, NULL, false},
      {"SANDBOX_MAX_CALLS", CFG_INT, "2048",
       "most gRPC calls in progress (each has a thread); more: RESOURCE_EXHAUSTED", 16, 65536, &c->max_calls, NULL,
       false},
      {"SANDBOX_MAX_OPEN_CALLS", CFG_INT, "64", "of those, most to methods anyone may call (health, reflection)", 4,
       65536, &c->max_open_calls, NULL, false},
      {"SANDBOX_FIRST_MESSAGE_SECONDS", CFG_INT, "10",
       "a call whose request has not arrived this long after it was accepted is cancelled", 1, 3600,
       &c->first_message_seconds, NULL, false},
      {"SANDBOX_MAX_CONNECTIONS", CFG_INT, "1024",
       "most client connections at once (plaintext; lowered to fit the open-file limit beside SANDBOX_MAX's "
       "descriptors); more: closed on arrival",
       16, 1048576, &c->max_connections, NULL, false},
      {"SANDBOX_MAX_CONNECTIONS_PER_PEER", CFG_INT, "64",
       "of those, most from one client address (plaintext); more: closed on arrival", 1, 1048576,
       &c->max_connections_per_peer, NULL, false},
      {"SANDBOX_CONNECTION_IDLE_SECONDS", CFG_INT, "300",
       "a client connection without calls this long is sent GOAWAY and closed", 1, 86400, &c->connection_idle_seconds,
       NULL, false},
      {"SANDBOX_SHUTDOWN_GRACE_SECONDS", CFG_INT, "10",
       "on SIGTERM (health turns NOT_SERVING, new calls get UNAVAILABLE \"shutting down\"), how long calls in "
       "flight may run before they are cancelled, and with SANDBOX_PERSIST_ON_SHUTDOWN how long persisting "
       "may take (calls get a quarter of it); the gateway exits as soon as nothing is left",
       0, 3600, &c->grace_seconds, NULL, false},
      {"SANDBOX_PERSIST_ON_SHUTDOWN", CFG_STRING, NULL,
       "on SIGTERM, persist every live sandbox to the snapshot store before deleting it (true/false); unset: "
       "true when SANDBOX_SNAPSHOT_DIR or CLOUD_RUN_SANDBOX_GCS_BUCKET is set, false with the default store",
       0, 0, &c->persist_on_shutdown_text, NULL, false},
      {"SANDBOX_GATEWAY_NAME", CFG_STRING, NULL,
       "this gateway's name, in Status and the start-up log (printable ASCII, no spaces, at most 253 "
       "characters); unset: the host name",
       0, 0, &c->gateway_name, NULL, false},
      {"SANDBOX_TLS_CERT", CFG_STRING, NULL, "PEM certificate chain; with SANDBOX_TLS_KEY, serve TLS", 0, 0,
       &c->tls_cert, NULL, false},
      {"SANDBOX_TLS_KEY", CFG_STRING, NULL, "PEM private key for SANDBOX_TLS_CERT", 0, 0, &c->tls_key, NULL, false},
      {"SANDBOX_TLS_CLIENT_CA", CFG_STRING, NULL,
       "PEM CA bundle; when set, clients must present a certificate it signed", 0, 0, &c->tls_client_ca, NULL, false},
      {"SANDBOX_HEALTH_LISTEN", CFG_STRING, NULL,
       "address (host:port) of a second, plaintext listener that answers grpc.health.v1.Health/Check and nothing "
       "else, for probes that cannot speak TLS (the kubelet's); unset: none",
       0, 0, &c->health_listen, NULL, false},
      {"SANDBOX_STATE_DIR", CFG_STRING, "/var/lib/sandbox-gateway",
       "where sandboxes keep their state (disks, mount points)", 0, 0, &c->state_dir, NULL, false},
      {"SANDBOX_ROOTFS", CFG_STRING, "/", "the image sandboxes see read-only under their writable overlay", 0, 0,
       &c->rootfs, NULL, false},
      {"SANDBOX_DISK_MB", CFG_INT, "2048", "writable overlay quota per sandbox, in MiB (a tmpfs)", 16, 1048576,
       &c->disk_mb, NULL, false},
      {"SANDBOX_MAX", CFG_INT, "0",
       "most live sandboxes; more: RESOURCE_EXHAUSTED; 0: sized from the machine's memory (MiB / 4, at least 16)", 0,
       100000, &c->max_sandboxes, NULL, false},
      {"SANDBOX_PIDS_MAX", CFG_INT, "512", "most processes per sandbox", 8, 4194304, &c->pids_max, NULL, false},
      {"SANDBOX_MEMORY_MB", CFG_INT, "2048", "memory limit per sandbox, in MiB", 16, 16777216, &c->memory_mb, NULL,
       false},
      {"SANDBOX_CPUS", CFG_STRING, NULL, "CPU limit per sandbox, in CPUs (e.g. 1.5); unset: unlimited", 0, 0,
       &c->cpus, NULL, false},
      {"SANDBOX_MAX_MEMORY_MB", CFG_INT, NULL,
       "most memory a launch may ask for (LaunchRequest.resources.memory_mb), in MiB; unset: SANDBOX_MEMORY_MB", 16,
       16777216, &c->max_memory_mb, NULL, false},
      {"SANDBOX_MAX_CPUS", CFG_STRING, NULL,
       "most CPUs a launch may ask for (resources.cpus, e.g. 2.5); unset: SANDBOX_CPUS, and with that unset too "
       "any",
       0, 0, &c->max_cpus, NULL, false},
      {"SANDBOX_MAX_DISK_MB", CFG_INT, NULL,
       "largest writable overlay a launch may ask for (resources.disk_mb), in MiB; unset: SANDBOX_DISK_MB", 16,
       1048576, &c->max_disk_mb, NULL, false},
      {"SANDBOX_MAX_PIDS", CFG_INT, NULL,
       "most processes a launch may ask for (resources.pids_max); unset: SANDBOX_PIDS_MAX", 8, 4194304, &c->max_pids,
       NULL, false},
      {"SANDBOX_IDLE_TTL", CFG_INT, "0", "delete a sandbox unused for this many seconds; 0: never", 0, 31536000,
       &c->idle_ttl, NULL, false},
      {"SANDBOX_MAX_IDLE_TTL", CFG_INT, NULL,
       "longest idle TTL a launch or an Extend may ask for (idle_ttl_seconds), in seconds; unset: 86400, or "
       "SANDBOX_IDLE_TTL when longer",
       1, 31536000, &c->max_idle_ttl, NULL, false},
      {"SANDBOX_MAX_LIFETIME", CFG_INT, "604800",
       "longest lifetime a launch or an Extend may ask for (max_lifetime_seconds), in seconds", 1, 31536000,
       &c->max_lifetime, NULL, false},
      {"ALLOW_EGRESS", CFG_BOOL, "false",
       "let sandboxes launched with allow_egress reach the network (never the host's loopback or link-local)", 0, 0,
       &c->allow_egress, NULL, false},
      {"SANDBOX_VOLUME_MOUNTS", CFG_STRING, NULL,
       "host paths bound into every sandbox: host:sandbox[:ro][:uid=N[:gid=M]],...; written as the sandbox's own "
       "host ids, or as owner N; ~ is the gateway's home; missing hosts skipped; nested ones refused",
       0, 0, &c->volume_mounts, NULL, false},
      {"SANDBOX_CGROUP_GROUP", CFG_STRING, "sandbox-gateway",
       "this instance's cgroup (under each hierarchy); instances sharing a machine need different ones", 0, 0,
       &c->cgroup_group, NULL, false},
      {"SANDBOX_SNAPSHOT_DIR", CFG_STRING, NULL,
       "the local snapshot store's directory; unset: $SANDBOX_STATE_DIR/snapshots", 0, 0, &c->snapshot_dir, NULL,
       false},
      {"CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX", CFG_STRING, "sandbox-snapshots/", "prefix of snapshot object names", 0, 0,
       &c->snapshot_prefix, NULL, false},
      {"CLOUD_RUN_SANDBOX_GCS_BUCKET", CFG_STRING, NULL,
       "persist snapshots to this Google Cloud Storage bucket; unset: the local store", 0, 0, &c->gcs_bucket, NULL,
       false},
      {"STORAGE_EMULATOR_HOST", CFG_STRING, NULL,
       "GCS: talk to this emulator (host:port or URL), without credentials", 0, 0, &c->gcs_emulator, NULL, false},
      {"GOOGLE_APPLICATION_CREDENTIALS", CFG_STRING, NULL,
       "GCS: service-account key file; unset: the metadata server's credentials", 0, 0, &c->gcs_credentials, NULL,
       false},
      {"GCE_METADATA_HOST", CFG_STRING, "metadata.google.internal", "GCS: the metadata server", 0, 0,
       &c->gcs_metadata_host, NULL, false},
      {"SANDBOX_GCS_CHUNK_MB", CFG_INT, "8", "GCS: resumable upload chunk, in MiB", 1, 1024, &c->gcs_chunk_mb, NULL,
       false},
      {"SANDBOX_GCS_RETRY_SECONDS", CFG_INT, "60", "GCS: how long one step is retried before it fails", 1, 3600,
       &c->gcs_retry_seconds, NULL, false},
      {"SANDBOX_EXPORT_FREEZE_SECONDS", CFG_INT, "300",
       "longest an export may keep a sandbox frozen (a stalled reader); past it the export fails and it thaws", 1,
       86400, &c->freeze_max_seconds, NULL, false},
      {"SANDBOX_SNAPSHOT_MAX_ENTRIES", CFG_INT, "1000000", "most entries a restored snapshot may have", 1, 100000000,
       &c->snapshot_max_entries, NULL, false},
      {"SANDBOX_SLIRP4NETNS", CFG_STRING, "slirp4netns", "user-mode networking program for egress sandboxes", 0, 0,
       &c->slirp4netns, NULL, false},
      {"SANDBOX_USERNS", CFG_BOOL, "true",
       "each sandbox in its own user namespace (root inside is an unprivileged host uid); false: round-1 "
       "behaviour, sandbox root is host root",
       0, 0, &c->userns, NULL, false},
      {"SANDBOX_UID_BASE", CFG_INT, "1000000", "first host uid (and gid) of the sandboxes' pool", 1, 4294967294L,
       &c->uid_base, NULL, false},
      {"SANDBOX_UID_RANGE", CFG_INT, "65536", "host uids per sandbox: its ids 0..RANGE-1 map onto its own range",
       65536, 16777216, &c->uid_range, NULL, false},
      {"SANDBOX_UID_SLOTS", CFG_INT, "0",
       "ranges in the pool: the gateway's block of host ids is SANDBOX_UID_BASE up to SANDBOX_UID_BASE + SLOTS x "
       "SANDBOX_UID_RANGE - 1, never more; 0: SANDBOX_MAX",
       0, 100000, &c->uid_slots, NULL, false},
      {"SANDBOX_UID_LOCK_DIR", CFG_STRING, "/run/sandbox-gateway/uid-blocks",
       "host directory where each gateway claims its uid block for its life (a locked file named for the block); "
       "a gateway whose block overlaps one claimed there refuses to start. Gateways sharing a host must see the "
       "same directory",
       0, 0, &c->uid_lock_dir, NULL, false},
      {"SANDBOX_HELPER", CFG_STRING, NULL, "path of sandbox-helper; unset: next to this program", 0, 0, &c->helper,
       NULL, false},
      {"SANDBOX_MAX_PROCESSES", CFG_INT, "64", "most detached processes running at once in one sandbox", 1, 4096,
       &c->max_processes, NULL, false},
      {"SANDBOX_PROCESS_RETAIN", CFG_INT, "16",
       "exited detached processes whose status one sandbox keeps (the oldest go first)", 0, 4096, &c->process_retain,
       NULL, false},
      {"SANDBOX_PROCESS_BUFFER_BYTES", CFG_INT, "1048576",
       "output a detached process keeps for attachers, per stream (the newest bytes)", 4096, 268435456,
       &c->process_buffer_bytes, NULL, false},
      {"SANDBOX_IDLE_TTL_COUNTS_PROCESSES", CFG_BOOL, "false",
       "a running detached process keeps its sandbox from being deleted as idle", 0, 0, &c->idle_counts_processes,
       NULL, false},
      {"SANDBOX_MAX_WATCHES", CFG_INT, "16", "most Watch calls (file change streams) running at once on one sandbox",
       1, 1024, &c->max_watches, NULL, false},
      {"SANDBOX_EXEC_BUFFER_TOTAL_MB", CFG_INT, "64",
       "output buffers all Exec and Run calls together hold beyond each one's first 16 KiB, in MiB; at it they read "
       "16 KiB at a time (a call's buffers grow up to 256 KiB only while its client keeps reading)",
       1, 65536, &c->exec_buffer_total_mb, NULL, false},
      {"SANDBOX_IMAGE_UID", CFG_INT, "900000",
       "first of the 65536 host ids that own the unpacked image layers (an unprivileged range outside the "
       "sandboxes' pool; sandboxes see it as their own ids 0..65535)",
       1, 4294901759L, &c->image_uid, NULL, false},
      {"SANDBOX_IMAGE_LAYER_MAX_MB", CFG_INT, "8192",
       "most MiB of file data one image layer may unpack to (a pull past it fails naming it): layers have no disk "
       "quota of their own",
       1, 1048576, &c->image_layer_max_mb, NULL, false},
      {"SANDBOX_IMAGE_CACHE_MB", CFG_INT, "16384",
       "MiB the unpacked image layers may take on disk; past it, after a pull, the least recently used images no "
       "live sandbox runs on are evicted (0: no budget)",
       0, 16777216, &c->image_cache_mb, NULL, false},
      {"SANDBOX_REGISTRY_AUTH_FILE", CFG_STRING, NULL,
       "a Docker config.json whose \"auths\" give registry credentials (user:password in base64) for pulls; "
       "unset: anonymous",
       0, 0, &c->registry_auth_file, NULL, false},
      {"SANDBOX_REGISTRY_CA", CFG_STRING, NULL,
       "PEM roots that registries' TLS certificates are verified against (a private registry's CA); unset: the "
       "system's",
       0, 0, &c->registry_ca, NULL, false},
      {"SANDBOX_REGISTRY_GOOGLE_HOSTS", CFG_STRING, "*-docker.pkg.dev,gcr.io,*.gcr.io",
       "registries (fnmatch patterns, comma-separated) that SANDBOX_REGISTRY_AUTH_FILE has no entry for and that "
       "are logged in to as `oauth2accesstoken` with a Google access token (GOOGLE_APPLICATION_CREDENTIALS, else "
       "the metadata server): Artifact Registry",
       0, 0, &c->registry_google_hosts, NULL, false},
      {"SANDBOX_INSECURE_REGISTRIES", CFG_STRING, NULL,
       "registries (host:port, comma-separated) pulled from over plain HTTP; every other one over verified TLS", 0, 0,
       &c->insecure_registries, NULL, false},
      {"SANDBOX_MAX_CONTEXTS", CFG_INT, "8",
       "most code contexts (Jupyter kernels, CreateContext) one sandbox may have; more: RESOURCE_EXHAUSTED", 1, 256,
       &c->max_contexts, NULL, false},
      {"SANDBOX_MAX_CONTEXTS_TOTAL", CFG_INT, "64",
       "most code contexts of all sandboxes together (each holds two gateway threads and up to ~100 MiB of queued "
       "kernel messages); more: RESOURCE_EXHAUSTED",
       1, 4096, &c->max_contexts_total, NULL, false},
      {"SANDBOX_WARM_POOL", CFG_STRING, NULL,
       "ready sandboxes kept made ahead of launches, per image: `default=N` (SANDBOX_ROOTFS; N at most 64); "
       "each holds what an idle sandbox holds and counts against SANDBOX_MAX; unset: no pool",
       0, 0, &c->warm_pool_text, NULL, false},
  };
  _Static_assert(sizeof table / sizeof table[0] == N_VARS, "N_VARS matches the table");
  memcpy (vars, table, sizeof table);
}

void
gw_config_print_help (FILE *out)
{
  gw_config_t c;
  cfg_var_t vars[N_VARS];
  vars_of (&c, vars);
  cfg_print_help (out, usage, vars, N_VARS);
}

/* The options after a volume's sandbox path: `ro` or `rw`, then
 * `uid=N` and `gid=N` (the host owner that sandbox root's writes land as;
 * gid defaults to uid). Into *ro, *uid and *gid (-1: none). */
static int
parse_volume_options (char *opts, bool *ro, long *uid, long *gid, err_t *err)
{
  *ro = false;
  *uid = *gid = -1;
  char *save = NULL;
  for (char *o = opts != NULL ? strtok_r (opts, ":", &save) : NULL; o != NULL; o = strtok_r (NULL, ":", &save))
    {
      long *id = strncmp (o, "uid=", 4) == 0 ? uid : strncmp (o, "gid=", 4) == 0 ? gid : NULL;
      if (id == NULL && (strcmp (o, "ro") == 0 || strcmp (o, "rw") == 0))
        {
          *ro = strcmp (o, "ro") == 0;
          continue;
        }
      char *end = NULL;
      errno = 0;
      long v = id != NULL ? strtol (o + 4, &end, 10) : -1;
      if (id == NULL || end == o + 4 || *end != '\0' || errno != 0)
        return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: option `%s` is not ro, rw, uid=N or gid=N", o);
      /* Host root would give sandbox root host root's powers over the files. */
      if (v <= 0 || v >= 4294967295L)
        return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s`: the owner must be a host id above 0", o);
      *id = v;
    }
  if (*gid >= 0 && *uid < 0)
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: gid= needs uid=");
  if (*uid >= 0 && *gid < 0)
    *gid = *uid;
  return 0;
}

/* The host path of a volume, ~ expanded, into *out (caller frees). */
static int
expand_home (const char *host, char **out, err_t *err)
{
  if (host[0] == '~' && host[1] != '\0' && host[1] != '/')
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s`: only ~ and ~/ are expanded", host);
  const char *home = getenv ("HOME");
  int n
      = host[0] == '~' ? asprintf (out, "%s%s", home != NULL ? home : "/root", host + 1) : asprintf (out, "%s", host);
  return n < 0 ? err_make (err, ENOMEM, "out of memory") : 0;
}

/* `path` as written, absolute, without `.` or `..` components, repeated
 * or trailing slashes: into *out (caller frees). Nesting is checked on
 * this form too, so that a path a sandbox can later turn into a symlink
 * (inside another volume, missing today) is refused whatever it resolves
 * to. */
static int
normalize_host_path (const char *path, char **out, err_t *err)
{
  if (path[0] != '/')
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s` is not an absolute host path", path);
  char *norm = malloc (strlen (path) + 2);
  if (norm == NULL)
    return err_make (err, ENOMEM, "out of memory");
  size_t n = 0;
  for (const char *p = path; *p != '\0';)
    {
      while (*p == '/')
        p++;
      size_t len = strcspn (p, "/");
      if (len == 0)
        break;
      if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
        {
          free (norm);
          return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s`: no . or .. in a host path", path);
        }
      norm[n++] = '/';
      memcpy (norm + n, p, len);
      n += len;
      p += len;
    }
  if (n == 0)
    norm[n++] = '/';
  norm[n] = '\0';
  *out = norm;
  return 0;
}

/* One SANDBOX_VOLUME_MOUNTS entry into its checked form
 * "realhost:sandbox[:ro][:uid=N:gid=M]" (*spec NULL: its host path is
 * missing, skipped with a warning). The host path is resolved once, here:
 * the runtime opens exactly that path, with no symlink in it. */
static int
parse_volume (char *tok, char **spec, char **lexical, err_t *err)
{
  *spec = NULL;
  *lexical = NULL;
  char *host = tok, *dst = strchr (tok, ':');
  if (dst == NULL)
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s` is not host:sandbox[:ro][:uid=N[:gid=N]]", tok);
  *dst++ = '\0';
  char *opts = strchr (dst, ':');
  if (opts != NULL)
    {
      *opts++ = '\0';
      if (*opts == '\0' || opts[strlen (opts) - 1] == ':' || strstr (opts, "::") != NULL)
        return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s`: an empty option", dst);
    }
  bool ro;
  long uid, gid;
  if (parse_volume_options (opts, &ro, &uid, &gid, err) < 0)
    return -1;
  if (dst[0] != '/' || strstr (dst, "..") != NULL || strcmp (dst, "/") == 0)
    return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s` is not an absolute sandbox path", dst);
  cleanup_free char *expanded = NULL;
  if (expand_home (host, &expanded, err) < 0)
    return -1;
  if (normalize_host_path (expanded, lexical, err) < 0)
    return -1;
  cleanup_free char *real = realpath (expanded, NULL);
  if (real == NULL)
    {
      log_fields (SEV_WARNING, json_pack ("{s:s}", "host_path", expanded),
                  "SANDBOX_VOLUME_MOUNTS: host path missing, skipped");
      return 0;
    }
  char owner[64] = "";
  if (uid >= 0)
    snprintf (owner, sizeof owner, ":uid=%ld:gid=%ld", uid, gid);
  if (asprintf (spec, "%s:%s%s%s", real, dst, ro ? ":ro" : "", owner) < 0)
    return err_make (err, ENOMEM, "out of memory");
  return 0;
}

/* Whether `path` is `dir` or lies below it. */
static bool
path_within (const char *path, const char *dir)
{
  size_t n = strlen (dir);
  if (n == 1 && dir[0] == '/')
    return true;
  return strncmp (path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* The owner id a checked volume spec names (`:uid=` or `:gid=`), or -1. */
static long
volume_owner (const char *spec, const char *key)
{
  const char *u = strstr (spec, key);
  return u != NULL ? strtol (u + strlen (key), NULL, 10) : -1;
}

/* Whether host paths `a` and `b` of two volumes nest: one lies strictly
 * inside the other. */
static bool
paths_nest (const char *a, const char *b)
{
  return strcmp (a, b) != 0 && (path_within (a, b) || path_within (b, a));
}

/* Refuses volumes whose host paths nest (a sandbox could replace the inner
 * one's path with a symlink through the outer, for every later launch),
 * compared as written (`lexical`, n of them, missing ones included: a
 * missing inner path is where a sandbox would plant the link) and as
 * resolved; a volume that holds, or lies in, a path hidden from sandboxes
 * (it would show it) or holds the image; and an owner inside the
 * sandboxes' id block. Equal host paths bound twice are fine. */
static int
check_volume_overlaps (const gw_config_t *c, char *const *lexical, size_t n, err_t *err)
{
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (paths_nest (lexical[i], lexical[j]))
        return err_make (err, EINVAL,
                         "SANDBOX_VOLUME_MOUNTS: `%s` and `%s` nest; nested volumes are refused, also when one is "
                         "missing (mount the outer one only, or two separate directories)",
                         lexical[i], lexical[j]);
  char a[PATH_MAX + 1], b[PATH_MAX + 1];
  for (size_t i = 0; c->volumes[i] != NULL; i++)
    {
      sbx_volume_host (c->volumes[i], a, sizeof a);
      long block_end = c->uid_base + c->uid_slots * c->uid_range;
      for (int k = 0; k < 2; k++)
        {
          long owner = volume_owner (c->volumes[i], k == 0 ? ":uid=" : ":gid=");
          if (c->userns && owner >= c->uid_base && owner < block_end)
            return err_make (err, EINVAL,
                             "SANDBOX_VOLUME_MOUNTS: the owner %s%ld of `%s` lies in the sandboxes' id block "
                             "(SANDBOX_UID_BASE %ld .. %ld)",
                             k == 0 ? "uid=" : "gid=", owner, a, c->uid_base, block_end - 1);
        }
      for (size_t j = 0; c->volumes[j] != NULL; j++)
        if (paths_nest (sbx_volume_host (c->volumes[j], b, sizeof b), a))
          return err_make (err, EINVAL,
                           "SANDBOX_VOLUME_MOUNTS: `%s` and `%s` nest once resolved; nested volumes are refused", a,
                           b);
      for (size_t j = 0; j < n; j++)
        if (paths_nest (lexical[j], a))
          return err_make (err, EINVAL,
                           "SANDBOX_VOLUME_MOUNTS: `%s` and `%s` (resolved) nest; nested volumes are refused",
                           lexical[j], a);
      for (size_t m = 0; m < GW_MAX_MASKS && c->masks[m] != NULL; m++)
        {
          cleanup_free char *real = realpath (c->masks[m], NULL);
          const char *hidden = real != NULL ? real : c->masks[m];
          if (path_within (hidden, a) || path_within (a, hidden))
            return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: the volume `%s` overlaps %s `%s`", a,
                             c->mask_names[m], hidden);
        }
      cleanup_free char *image = realpath (c->rootfs, NULL);
      if (image != NULL && path_within (image, a))
        return err_make (err, EINVAL,
                         "SANDBOX_VOLUME_MOUNTS: the volume `%s` holds SANDBOX_ROOTFS `%s` (sandboxes would write "
                         "every sandbox's image)",
                         a, image);
    }
  return 0;
}

/* Parses SANDBOX_VOLUME_MOUNTS into `volumes`, expanding ~ and skipping
 * (with a warning) host paths that do not exist. */
static int
parse_volumes (gw_config_t *c, err_t *err)
{
  if (c->volume_mounts == NULL)
    return 0;
  size_t n = 0, n_lex = 0;
  char *lexical[GW_MAX_VOLUME_ENTRIES];
  int rc = 0;
  char *save = NULL;
  for (char *tok = strtok_r (c->volume_mounts, ",", &save); tok != NULL && rc == 0; tok = strtok_r (NULL, ",", &save))
    {
      char *spec = NULL, *lex = NULL;
      if (n_lex == GW_MAX_VOLUME_ENTRIES)
        rc = err_make (err, E2BIG, "SANDBOX_VOLUME_MOUNTS: more than %d entries", GW_MAX_VOLUME_ENTRIES);
      else
        {
          rc = parse_volume (tok, &spec, &lex, err);
          if (lex != NULL)
            lexical[n_lex++] = lex;
        }
      if (rc < 0 || spec == NULL)
        continue;
      if (n == GW_MAX_VOLUMES)
        {
          free (spec);
          rc = err_make (err, E2BIG, "SANDBOX_VOLUME_MOUNTS: more than %d mounts", GW_MAX_VOLUMES);
          continue;
        }
      c->volumes[n++] = spec;
    }
  c->volumes[n] = NULL;
  if (rc == 0)
    rc = check_volume_overlaps (c, lexical, n_lex, err);
  for (size_t i = 0; i < n_lex; i++)
    free (lexical[i]);
  return rc;
}

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
  cfg_var_t vars[N_VARS];
  vars_of (c, vars);
  if (cfg_load (vars, N_VARS, err) < 0)
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
  return parse_volumes (c, err);
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
  cfg_var_t vars[N_VARS];
  vars_of (c, vars);
  for (size_t i = 0; i < N_VARS; i++)
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
