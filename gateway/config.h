/* config: the gateway's configuration, from the environment.
 *
 * One table describes every variable (name, default, bounds, help: see
 * common/config.h); gw_config_load() reads it, checks what the table cannot
 * (addresses, paths, pairs that go together, the volume list) and derives
 * what the runtime needs (CPU millis, volumes, paths hidden from
 * sandboxes, the unpacker's path), whether to persist sandboxes on
 * shutdown, and the gateway's name. A unit of its own so tests can drive it.
 *
 * Threading: start-up only, before any thread exists (it reads the
 * environment and sets the log level).
 */
#ifndef SBX_GATEWAY_CONFIG_H
#define SBX_GATEWAY_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "common/err.h"
#include "gateway/runtime/runtime.h"

/* Most SANDBOX_VOLUME_MOUNTS entries. */
#define GW_MAX_VOLUMES SBX_MAX_VOLUMES
/* Most SANDBOX_VOLUME_MOUNTS entries, missing host paths included. */
#define GW_MAX_VOLUME_ENTRIES (2 * GW_MAX_VOLUMES)
/* Host paths hidden inside sandboxes: state, snapshots, TLS key, credentials. */
#define GW_MAX_MASKS 4
/* Longest SANDBOX_GATEWAY_NAME: a DNS name's length. */
#define GW_NAME_MAX 253

typedef struct gw_config_s
{
  char *listen;
  char *secret;
  char *log_level;
  long max_message_mb;
  long max_calls;
  long max_open_calls;
  long first_message_seconds;
  long max_connections;
  long max_connections_per_peer;
  long connection_idle_seconds;
  long grace_seconds;
  char *persist_on_shutdown_text; /* SANDBOX_PERSIST_ON_SHUTDOWN as given, or NULL */
  char *gateway_name;             /* SANDBOX_GATEWAY_NAME, else the host name */
  char *tls_cert;
  char *tls_key;
  char *tls_client_ca;
  char *health_listen; /* SANDBOX_HEALTH_LISTEN, or NULL */
  char *state_dir;
  char *rootfs;
  char *helper;
  long disk_mb;
  long max_sandboxes;
  long pids_max;
  long memory_mb;
  char *cpus;
  long max_memory_mb; /* SANDBOX_MAX_MEMORY_MB, resolved: never below memory_mb */
  char *max_cpus;     /* SANDBOX_MAX_CPUS as given, or NULL */
  long max_disk_mb;   /* SANDBOX_MAX_DISK_MB, resolved */
  long max_pids;      /* SANDBOX_MAX_PIDS, resolved */
  long idle_ttl;
  long max_idle_ttl; /* SANDBOX_MAX_IDLE_TTL, resolved */
  long max_lifetime; /* SANDBOX_MAX_LIFETIME */
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
  long image_layer_max_mb;
  long image_cache_mb;         /* SANDBOX_IMAGE_CACHE_MB */
  char *registry_ca;           /* SANDBOX_REGISTRY_CA, or NULL */
  char *registry_google_hosts; /* SANDBOX_REGISTRY_GOOGLE_HOSTS */
  long freeze_max_seconds;
  bool userns;
  long uid_base;
  long uid_range;
  long uid_slots;     /* SANDBOX_UID_SLOTS, resolved: never 0 with userns */
  char *uid_lock_dir; /* SANDBOX_UID_LOCK_DIR */
  long max_processes;
  long process_retain;
  long process_buffer_bytes;
  long max_watches;
  long exec_buffer_total_mb;
  long image_uid;            /* SANDBOX_IMAGE_UID */
  char *registry_auth_file;  /* SANDBOX_REGISTRY_AUTH_FILE, or NULL */
  char *insecure_registries; /* SANDBOX_INSECURE_REGISTRIES, or NULL */
  bool idle_counts_processes;
  long max_contexts;       /* SANDBOX_MAX_CONTEXTS */
  long max_contexts_total; /* SANDBOX_MAX_CONTEXTS_TOTAL */
  char *warm_pool_text;    /* SANDBOX_WARM_POOL as given, or NULL */
  long warm_pool;          /* its `default` count */

  /* Derived by gw_config_load. */
  bool persist_on_shutdown; /* SANDBOX_PERSIST_ON_SHUTDOWN, or whether a store was chosen */
  long cpu_millis;          /* 0: unlimited */
  long max_cpu_millis;      /* SANDBOX_MAX_CPUS (else SANDBOX_CPUS), 0: any */
  /* "realhost:sandbox[:ro][:uid=N:gid=M]", NULL-terminated; no two nest,
   * none overlaps a mask */
  char *volumes[GW_MAX_VOLUMES + 1];
  const char *masks[GW_MAX_MASKS + 1];      /* NULL-terminated, borrowed from fields above */
  const char *mask_names[GW_MAX_MASKS + 1]; /* the variable each mask comes from */
  char *unpacker;                           /* sandbox-unpack, beside sandbox-helper */
} gw_config_t;

/* Reads and checks the environment into *cfg (zeroed first). The message
 * of a failure names the variable. Release with gw_config_release, also
 * after a failure. */
int gw_config_load (gw_config_t *cfg, err_t *err);

/* SANDBOX_MAX_IDLE_TTL when unset (and SANDBOX_IDLE_TTL is shorter): a day. */
#define GW_DEFAULT_MAX_IDLE_TTL 86400

/* Descriptors the gateway holds per live sandbox, and those it keeps for
 * everything else (calls, pipes, streams). */
#define GW_FDS_PER_SANDBOX 2
#define GW_FDS_RESERVED 2048
/* SANDBOX_MAX_CONNECTIONS is never lowered below this to fit. */
#define GW_MIN_CONNECTIONS 16

/* SANDBOX_MAX when it is 0: a quarter of the machine's memory in MiB, no
 * more than the open-file hard limit leaves room for, at least 16, at most
 * `cap` (the uid pool's ranges). */
long gw_default_max_sandboxes (long cap);

/* Checks what the configuration names on the filesystem, naming the
 * variable on failure: SANDBOX_ROOTFS is a directory; SANDBOX_STATE_DIR is
 * (or, when missing, is made as) a writable directory; the TLS files are
 * readable regular files holding PEM. Kept apart from gw_config_load so
 * that parsing stays free of the filesystem. */
int gw_config_check_files (const gw_config_t *cfg, err_t *err);

/* Frees what gw_config_load allocated. */
void gw_config_release (gw_config_t *cfg);

/* Prints --help: the usage line and every variable with its default. */
void gw_config_print_help (FILE *out);

/* The runtime's part of the configuration (strings borrowed from cfg). */
void gw_config_runtime (const gw_config_t *cfg, sbx_config_t *out);

#endif
