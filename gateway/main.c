/* sandbox-gateway: the gRPC server that owns the sandboxes of its machine.
 *
 * main() reads the configuration from the environment (see --help), serves
 * sandbox.v1.Sandbox, grpc.health.v1.Health and server reflection, and
 * shuts down gracefully on SIGTERM or SIGINT: health turns NOT_SERVING, no
 * new calls are accepted, calls in flight get SANDBOX_SHUTDOWN_GRACE_SECONDS
 * to finish, the rest are cancelled.
 *
 * Threading: signals are blocked before any thread starts and taken with
 * sigwait() on the main thread; everything else runs on the call layer's
 * threads.
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rpc.h"
#include "gateway/gcs/gcs.h"
#include "gateway/health.h"
#include "gateway/reflection.h"
#include "gateway/sbx_runtime.h"
#include "gateway/service.h"
#include "gateway/snap_rpc.h"
#include "gateway/snap_store.h"

extern const unsigned char gateway_descriptor_set[];
extern const size_t gateway_descriptor_set_len;

static struct
{
  char *listen;
  char *secret;
  char *log_level;
  long max_message_mb;
  long grace_seconds;
  char *tls_cert;
  char *tls_key;
  char *tls_client_ca;
  char *state_dir;
  char *rootfs;
  char *helper;
  long disk_mb;
  long max_sandboxes;
  long pids_max;
  long memory_mb;
  char *cpus;
  long idle_ttl;
  bool allow_egress;
  char *volume_mounts;
  char *slirp4netns;
  char *cgroup_group;
  char *snapshot_dir;
  char *gcs_bucket;
  char *gcs_emulator;
  char *gcs_credentials;
  char *gcs_metadata_host;
  long gcs_chunk_mb;
  long gcs_retry_seconds;
  char *snapshot_prefix;
  long snapshot_max_entries;
} cfg;

static const cfg_var_t gateway_vars[] = {
    {"SANDBOX_LISTEN", CFG_STRING, "127.0.0.1:50051", "address the gRPC server listens on (host:port; port 0 picks one)",
     0, 0, &cfg.listen, NULL, false},
    {"CLOUD_RUN_SANDBOX_GATEWAY_SECRET", CFG_STRING, NULL,
     "bearer secret every sandbox.v1.Sandbox call must present; unset: every call fails UNAVAILABLE", 0, 0,
     &cfg.secret, NULL, true},
    {"SANDBOX_LOG_LEVEL", CFG_STRING, "info", "lowest log severity written: debug, info, warning or error", 0, 0,
     &cfg.log_level, NULL, false},
    {"SANDBOX_MAX_MESSAGE_MB", CFG_INT, "16", "largest gRPC message accepted or sent, in MiB", 1, 1024,
     &cfg.max_message_mb, NULL, false},
    {"SANDBOX_SHUTDOWN_GRACE_SECONDS", CFG_INT, "10",
     "on SIGTERM, how long calls in flight may run before they are cancelled", 0, 3600, &cfg.grace_seconds, NULL,
     false},
    {"SANDBOX_TLS_CERT", CFG_STRING, NULL, "PEM certificate chain; with SANDBOX_TLS_KEY, serve TLS", 0, 0,
     &cfg.tls_cert, NULL, false},
    {"SANDBOX_TLS_KEY", CFG_STRING, NULL, "PEM private key for SANDBOX_TLS_CERT", 0, 0, &cfg.tls_key, NULL, false},
    {"SANDBOX_TLS_CLIENT_CA", CFG_STRING, NULL, "PEM CA bundle; when set, clients must present a certificate it signed",
     0, 0, &cfg.tls_client_ca, NULL, false},
    {"SANDBOX_STATE_DIR", CFG_STRING, "/var/lib/sandbox-gateway", "where sandboxes keep their state (disks, mount points)",
     0, 0, &cfg.state_dir, NULL, false},
    {"SANDBOX_ROOTFS", CFG_STRING, "/", "the image sandboxes see read-only under their writable overlay", 0, 0,
     &cfg.rootfs, NULL, false},
    {"SANDBOX_DISK_MB", CFG_INT, "2048", "writable overlay quota per sandbox, in MiB (a tmpfs)", 16, 1048576,
     &cfg.disk_mb, NULL, false},
    {"SANDBOX_MAX", CFG_INT, "256", "most live sandboxes; more: RESOURCE_EXHAUSTED", 1, 100000, &cfg.max_sandboxes,
     NULL, false},
    {"SANDBOX_PIDS_MAX", CFG_INT, "512", "most processes per sandbox", 8, 4194304, &cfg.pids_max, NULL, false},
    {"SANDBOX_MEMORY_MB", CFG_INT, "2048", "memory limit per sandbox, in MiB", 16, 16777216, &cfg.memory_mb, NULL,
     false},
    {"SANDBOX_CPUS", CFG_STRING, NULL, "CPU limit per sandbox, in CPUs (e.g. 1.5); unset: unlimited", 0, 0, &cfg.cpus,
     NULL, false},
    {"SANDBOX_IDLE_TTL", CFG_INT, "0", "delete a sandbox unused for this many seconds; 0: never", 0, 31536000,
     &cfg.idle_ttl, NULL, false},
    {"ALLOW_EGRESS", CFG_BOOL, "false",
     "let sandboxes launched with allow_egress reach the network (never the host's loopback or link-local)", 0, 0,
     &cfg.allow_egress, NULL, false},
    {"SANDBOX_VOLUME_MOUNTS", CFG_STRING, NULL,
     "host paths bound into every sandbox: host:sandbox[:ro],...; ~ is the gateway's home; missing hosts skipped", 0,
     0, &cfg.volume_mounts, NULL, false},
    {"SANDBOX_CGROUP_GROUP", CFG_STRING, "sandbox-gateway",
     "this instance's cgroup (under each hierarchy); instances sharing a machine need different ones", 0, 0,
     &cfg.cgroup_group, NULL, false},
    {"SANDBOX_SNAPSHOT_DIR", CFG_STRING, NULL, "the local snapshot store's directory; unset: $SANDBOX_STATE_DIR/snapshots",
     0, 0, &cfg.snapshot_dir, NULL, false},
    {"CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX", CFG_STRING, "sandbox-snapshots/", "prefix of snapshot object names", 0, 0,
     &cfg.snapshot_prefix, NULL, false},
    {"CLOUD_RUN_SANDBOX_GCS_BUCKET", CFG_STRING, NULL,
     "persist snapshots to this Google Cloud Storage bucket; unset: the local store", 0, 0, &cfg.gcs_bucket, NULL,
     false},
    {"STORAGE_EMULATOR_HOST", CFG_STRING, NULL, "GCS: talk to this emulator (host:port or URL), without credentials",
     0, 0, &cfg.gcs_emulator, NULL, false},
    {"GOOGLE_APPLICATION_CREDENTIALS", CFG_STRING, NULL,
     "GCS: service-account key file; unset: the metadata server's credentials", 0, 0, &cfg.gcs_credentials, NULL,
     false},
    {"GCE_METADATA_HOST", CFG_STRING, "metadata.google.internal", "GCS: the metadata server", 0, 0,
     &cfg.gcs_metadata_host, NULL, false},
    {"SANDBOX_GCS_CHUNK_MB", CFG_INT, "8", "GCS: resumable upload chunk, in MiB", 1, 1024, &cfg.gcs_chunk_mb, NULL,
     false},
    {"SANDBOX_GCS_RETRY_SECONDS", CFG_INT, "60", "GCS: how long one step is retried before it fails", 1, 3600,
     &cfg.gcs_retry_seconds, NULL, false},
    {"SANDBOX_SNAPSHOT_MAX_ENTRIES", CFG_INT, "1000000", "most entries a restored snapshot may have", 1, 100000000,
     &cfg.snapshot_max_entries, NULL, false},
    {"SANDBOX_SLIRP4NETNS", CFG_STRING, "slirp4netns", "user-mode networking program for egress sandboxes", 0, 0,
     &cfg.slirp4netns, NULL, false},
    {"SANDBOX_HELPER", CFG_STRING, NULL, "path of sandbox-helper; unset: next to this program", 0, 0, &cfg.helper,
     NULL, false},
};

#define N_VARS (sizeof gateway_vars / sizeof gateway_vars[0])

static const char *const served_services[] = {
    SERVICE_NAME,
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    NULL,
};

static const char usage[]
    = "Usage: sandbox-gateway [--help]\n\n"
      "Serves sandbox.v1.Sandbox (isolated Linux sandboxes: launch, exec with streamed\n"
      "output, snapshots), grpc.health.v1.Health and gRPC server reflection.\n"
      "Configuration comes from the environment only.";

static char *volumes[33];
static const char *masks[8];
static char *unpacker;
static long cpu_millis;

/* Parses SANDBOX_VOLUME_MOUNTS into `volumes`, expanding ~ and skipping
 * (with a warning) host paths that do not exist. */
static int
parse_volumes (err_t *err)
{
  if (cfg.volume_mounts == NULL)
    return 0;
  size_t n = 0;
  char *save = NULL;
  for (char *tok = strtok_r (cfg.volume_mounts, ",", &save); tok != NULL; tok = strtok_r (NULL, ",", &save))
    {
      char *host = tok, *dst = strchr (tok, ':');
      if (dst == NULL)
        return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s` is not host:sandbox[:ro]", tok);
      *dst++ = '\0';
      char *mode = strchr (dst, ':');
      if (mode != NULL)
        {
          *mode++ = '\0';
          if (strcmp (mode, "ro") != 0 && strcmp (mode, "rw") != 0)
            return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: mode `%s` is not ro or rw", mode);
        }
      if (dst[0] != '/' || strstr (dst, "..") != NULL || strcmp (dst, "/") == 0)
        return err_make (err, EINVAL, "SANDBOX_VOLUME_MOUNTS: `%s` is not an absolute sandbox path", dst);
      char *expanded = NULL;
      if (host[0] == '~')
        {
          const char *home = getenv ("HOME");
          if (asprintf (&expanded, "%s%s", home != NULL ? home : "/root", host + 1) < 0)
            return err_make (err, ENOMEM, "out of memory");
        }
      else if (asprintf (&expanded, "%s", host) < 0)
        return err_make (err, ENOMEM, "out of memory");
      if (access (expanded, F_OK) != 0)
        {
          log_fields (SEV_WARNING, json_pack ("{s:s}", "host_path", expanded),
                      "SANDBOX_VOLUME_MOUNTS: host path missing, skipped");
          free (expanded);
          continue;
        }
      if (n == 32)
        return err_make (err, E2BIG, "SANDBOX_VOLUME_MOUNTS: more than 32 mounts");
      char *spec = NULL;
      if (asprintf (&spec, "%s:%s%s", expanded, dst, mode != NULL && strcmp (mode, "ro") == 0 ? ":ro" : "") < 0)
        return err_make (err, ENOMEM, "out of memory");
      free (expanded);
      volumes[n++] = spec;
    }
  volumes[n] = NULL;
  return 0;
}

static int
load_config (err_t *err)
{
  if (cfg_load (gateway_vars, N_VARS, err) < 0)
    return -1;
  log_level_t level;
  if (log_parse_level (cfg.log_level, &level) < 0)
    return err_make (err, EINVAL, "SANDBOX_LOG_LEVEL: `%s` is not one of debug, info, warning, error",
                     cfg.log_level);
  log_set_level (level);
  const char *colon = strrchr (cfg.listen, ':');
  char *port_end = NULL;
  long port = colon != NULL ? strtol (colon + 1, &port_end, 10) : -1;
  if (colon == NULL || colon == cfg.listen || port_end == colon + 1 || *port_end != '\0' || port < 0
      || port > 65535)
    return err_make (err, EINVAL, "SANDBOX_LISTEN: `%s` is not host:port with a port in 0..65535", cfg.listen);
  if ((cfg.tls_cert != NULL) != (cfg.tls_key != NULL))
    return err_make (err, EINVAL, "SANDBOX_TLS_CERT and SANDBOX_TLS_KEY must be set together");
  if (cfg.tls_client_ca != NULL && cfg.tls_cert == NULL)
    return err_make (err, EINVAL, "SANDBOX_TLS_CLIENT_CA needs SANDBOX_TLS_CERT and SANDBOX_TLS_KEY");
  if (cfg.cpus != NULL)
    {
      char *end = NULL;
      double cpus = strtod (cfg.cpus, &end);
      if (end == cfg.cpus || *end != '\0' || cpus < 0.01 || cpus > 4096)
        return err_make (err, EINVAL, "SANDBOX_CPUS: `%s` is not a number of CPUs in [0.01, 4096]", cfg.cpus);
      cpu_millis = (long) (cpus * 1000 + 0.5);
    }
  if (cfg.state_dir[0] != '/' || cfg.rootfs[0] != '/')
    return err_make (err, EINVAL, "SANDBOX_STATE_DIR and SANDBOX_ROOTFS must be absolute paths");
  if (cfg.helper == NULL)
    {
      char self[4096];
      ssize_t n = readlink ("/proc/self/exe", self, sizeof self - 1);
      if (n <= 0)
        return err_make_sys (err, errno, "find this program's path");
      self[n] = '\0';
      *strrchr (self, '/') = '\0';
      if (asprintf (&cfg.helper, "%s/sandbox-helper", self) < 0)
        return err_make (err, ENOMEM, "out of memory");
    }
  if (cfg.snapshot_dir == NULL && asprintf (&cfg.snapshot_dir, "%s/snapshots", cfg.state_dir) < 0)
    return err_make (err, ENOMEM, "out of memory");
  if (strstr (cfg.snapshot_prefix, "..") != NULL || cfg.snapshot_prefix[0] == '/')
    return err_make (err, EINVAL, "CLOUD_RUN_SANDBOX_SNAPSHOT_PREFIX: `%s` must be relative, without ..",
                     cfg.snapshot_prefix);
  /* What sandboxes must not see of the gateway's own files, should the image
   * (the lower layer) contain them: state, snapshots, keys, credentials. */
  size_t m = 0;
  const char *secret_paths[] = {cfg.state_dir, cfg.snapshot_dir, cfg.tls_key, cfg.gcs_credentials};
  for (size_t i = 0; i < sizeof secret_paths / sizeof secret_paths[0]; i++)
    if (secret_paths[i] != NULL && secret_paths[i][0] == '/')
      masks[m++] = secret_paths[i];
  masks[m] = NULL;

  /* sandbox-unpack lives beside sandbox-helper. */
  char *slash = strrchr (cfg.helper, '/');
  if (asprintf (&unpacker, "%.*ssandbox-unpack", slash != NULL ? (int) (slash - cfg.helper + 1) : 0, cfg.helper) < 0)
    return err_make (err, ENOMEM, "out of memory");
  return parse_volumes (err);
}

int
main (int argc, char **argv)
{
  log_set_program ("sandbox-gateway");
  for (int i = 1; i < argc; i++)
    {
      if (strcmp (argv[i], "--help") == 0 || strcmp (argv[i], "-h") == 0)
        {
          cfg_print_help (stdout, usage, gateway_vars, N_VARS);
          return 0;
        }
      fprintf (stderr, "sandbox-gateway: unknown argument `%s` (see --help)\n", argv[i]);
      return 2;
    }

  err_t err = ERR_INIT;
  if (load_config (&err) < 0)
    {
      log_msg (SEV_ERROR, "configuration: %s", err_msg (&err));
      err_release (&err);
      return 2;
    }
  if (cfg.secret == NULL)
    log_msg (SEV_WARNING, "CLOUD_RUN_SANDBOX_GATEWAY_SECRET is not set: every sandbox call will fail UNAVAILABLE");

  /* Block the shutdown signals in every thread; main takes them with sigwait. */
  sigset_t sigs;
  sigemptyset (&sigs);
  sigaddset (&sigs, SIGTERM);
  sigaddset (&sigs, SIGINT);
  pthread_sigmask (SIG_BLOCK, &sigs, NULL);
  signal (SIGPIPE, SIG_IGN);

  /* Sandboxes' pid 1s outlive the helper that forks them: adopt them, so
   * that deleting a sandbox reaps its pid 1 at once. */
  prctl (PR_SET_CHILD_SUBREAPER, 1);

  /* Streams pass through in pieces of up to a few MiB: give them back to
   * the system when freed (glibc would otherwise raise its mmap threshold
   * after the first free and keep them in per-thread arenas), so resident
   * memory stays flat however much data flows. */
  mallopt (M_MMAP_THRESHOLD, 256 * 1024);

  rpc_init ();
  rpc_opts_t opts = {
      .fixed_window = true,
      .max_message_bytes = (size_t) cfg.max_message_mb * 1024 * 1024,
      .tls_cert_file = cfg.tls_cert,
      .tls_key_file = cfg.tls_key,
      .tls_ca_file = cfg.tls_client_ca,
  };
  sbx_config_t rcfg = {
      .state_dir = cfg.state_dir,
      .rootfs = cfg.rootfs,
      .helper = cfg.helper,
      .unpacker = unpacker,
      .cgroup_mount = "/sys/fs/cgroup",
      .cgroup_group = cfg.cgroup_group,
      .slirp4netns = cfg.slirp4netns,
      .disk_mb = cfg.disk_mb,
      .max_sandboxes = cfg.max_sandboxes,
      .pids_max = cfg.pids_max,
      .memory_mb = cfg.memory_mb,
      .cpu_millis = cpu_millis,
      .idle_ttl_seconds = cfg.idle_ttl,
      .allow_egress = cfg.allow_egress,
      .volumes = (const char *const *) volumes,
      .snapshot_max_entries = cfg.snapshot_max_entries,
      .masks = masks,
  };
  sbx_runtime_t *rt = NULL;
  rpc_server_t *server = NULL;
  int port = 0;
  snap_store_t *store = NULL;
  int rc = sbx_runtime_new (&rcfg, &rt, &err);
  if (rc == 0 && cfg.gcs_bucket != NULL)
    {
      gcs_config_t g;
      gcs_config_from_env (&g);
      g.bucket = cfg.gcs_bucket;
      g.prefix = cfg.snapshot_prefix;
      g.emulator_host = cfg.gcs_emulator;
      g.credentials_file = cfg.gcs_credentials;
      g.metadata_host = cfg.gcs_metadata_host;
      g.chunk_size = (size_t) cfg.gcs_chunk_mb * 1024 * 1024;
      g.retry_budget_ms = (unsigned) cfg.gcs_retry_seconds * 1000;
      rc = gcs_store_new (&g, &store, &err);
    }
  else if (rc == 0)
    rc = snap_store_local_new (cfg.snapshot_dir, cfg.snapshot_prefix, &store, &err);
  if (rc == 0)
    log_fields (SEV_INFO,
                json_pack ("{s:s, s:s}", "store", store->kind, "where",
                           cfg.gcs_bucket != NULL ? cfg.gcs_bucket : cfg.snapshot_dir),
                "snapshot store");
  if (rc == 0)
    snap_rpc_init (rt, store);
  if (rc == 0)
    rc = rpc_server_new (&opts, &server, &err);
  if (rc == 0)
    rc = service_register (server, cfg.secret, rt, &err);
  if (rc == 0)
    rc = health_register (server, served_services, &err);
  if (rc == 0)
    rc = reflection_register (server, gateway_descriptor_set, gateway_descriptor_set_len, &err);
  if (rc == 0 && (rc = rpc_server_start (server, cfg.listen, &port, &err)) < 0)
    err_wrap (&err, "SANDBOX_LISTEN");
  if (rc < 0)
    {
      log_msg (SEV_ERROR, "start: %s", err_msg (&err));
      err_release (&err);
      rpc_server_destroy (server);
      sbx_runtime_destroy (rt);
      if (store != NULL)
        store->ops->destroy (store);
      reflection_release ();
      rpc_shutdown ();
      return 1;
    }
  log_fields (SEV_INFO, json_pack ("{s:s, s:i, s:b}", "address", cfg.listen, "port", port, "tls", cfg.tls_cert != NULL),
              "listening");

  int sig = 0;
  sigwait (&sigs, &sig);
  log_fields (SEV_INFO, json_pack ("{s:s, s:i}", "signal", strsignal (sig), "grace_seconds", (int) cfg.grace_seconds),
              "shutting down");
  health_shutdown ();
  sbx_runtime_stop (rt);
  rpc_server_shutdown (server, cfg.grace_seconds * 1000);
  rpc_server_destroy (server);
  sbx_runtime_destroy (rt);
  store->ops->destroy (store);
  reflection_release ();
  rpc_shutdown ();
  log_msg (SEV_INFO, "stopped");
  return 0;
}
