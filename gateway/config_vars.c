/* config_vars: the table of the gateway's variables — every SANDBOX_* and
 * CLOUD_RUN_* name with its type, default, bounds, help and target in a
 * gw_config_t — and --help, printed from it. Reading and checking the
 * values is config.c's (through common/config), volumes config_volumes.c's.
 * No state; start-up only. */
#include <string.h>

#include "common/config.h"
#include "gateway/config.h"
#include "gateway/config_internal.h"

static const char usage[] = "Usage: sandbox-gateway [--help]\n\n"
                            "Serves sandbox.v1.Sandbox (isolated Linux sandboxes: launch, exec with streamed\n"
                            "output, snapshots), grpc.health.v1.Health and gRPC server reflection.\n"
                            "Configuration comes from the environment only.";

/* The table of variables, with targets in *c. */
void
gw_config_vars (gw_config_t *c, cfg_var_t vars[GW_CONFIG_N_VARS])
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
  _Static_assert(sizeof table / sizeof table[0] == GW_CONFIG_N_VARS, "GW_CONFIG_N_VARS matches the table");
  memcpy (vars, table, sizeof table);
}

void
gw_config_print_help (FILE *out)
{
  gw_config_t c;
  cfg_var_t vars[GW_CONFIG_N_VARS];
  gw_config_vars (&c, vars);
  cfg_print_help (out, usage, vars, GW_CONFIG_N_VARS);
}
