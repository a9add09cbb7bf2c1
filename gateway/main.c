/* sandbox-gateway: the gRPC server that owns the sandboxes of its machine.
 *
 * main() reads the configuration from the environment (config.c, see
 * --help), serves sandbox.v1.Sandbox (api/), grpc.health.v1.Health and
 * server reflection, and shuts down gracefully on SIGTERM or SIGINT: health
 * turns NOT_SERVING, new sandbox calls are answered UNAVAILABLE "shutting
 * down", calls in flight get SANDBOX_SHUTDOWN_GRACE_SECONDS to finish (a
 * quarter of it with SANDBOX_PERSIST_ON_SHUTDOWN, whose persist of every
 * live sandbox gets the rest), the rest are cancelled, and the sandboxes
 * are deleted; it exits as soon as nothing is left.
 *
 * Threading: signals are blocked before any thread starts and taken with
 * sigwait() on the main thread; everything else runs on the call layer's
 * threads.
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>
#include <stdlib.h>
#include <pthread.h>

#include "common/err.h"
#include "common/log.h"
#include "common/rpc/rpc.h"
#include "gateway/api/api.h"
#include "gateway/api/health.h"
#include "gateway/api/reflection.h"
#include "gateway/code/kernel.h"
#include "gateway/config.h"
#include "gateway/runtime/runtime.h"
#include "gateway/snapshot/drain.h"
#include "gateway/snapshot/expire.h"
#include "gateway/image/image.h"
#include "gateway/store/gcs/gcs.h"
#include "gateway/store/open.h"

extern const unsigned char gateway_descriptor_set[];
extern const size_t gateway_descriptor_set_len;

static const char *const served_services[] = {
    API_SERVICE_NAME,
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    NULL,
};

/* The plaintext health listener (SANDBOX_HEALTH_LISTEN): Check alone, so
 * few calls at once and small messages. A call beyond the cap is refused
 * RESOURCE_EXHAUSTED without a thread; a call whose request has not
 * arrived by the deadline is cancelled. */
#define GW_HEALTH_MAX_CALLS 16
#define GW_HEALTH_MAX_MESSAGE_BYTES (64 * 1024)
#define GW_HEALTH_FIRST_MESSAGE_MS 2000

/* Everything the running gateway holds. */
typedef struct gateway_s
{
  gw_config_t cfg;
  sbx_runtime_t *rt;
  snap_store_t *store;
  img_cache_t *images;
  rpc_server_t *server;
  api_t *api;
  int port;
  rpc_server_t *health_server; /* SANDBOX_HEALTH_LISTEN, or NULL */
  int health_port;
  gcs_tokens_t *google; /* Google credentials for the registries that want them */
} gateway_t;

static int
google_token (void *ctx, char **token, err_t *err)
{
  return gcs_tokens_get (ctx, token, err);
}

/* Process-wide settings made before any thread starts. */
static void
set_up_process (sigset_t *sigs)
{
  /* Block the shutdown signals in every thread; main takes them with sigwait. */
  sigemptyset (sigs);
  sigaddset (sigs, SIGTERM);
  sigaddset (sigs, SIGINT);
  pthread_sigmask (SIG_BLOCK, sigs, NULL);
  signal (SIGPIPE, SIG_IGN);
  /* Sandboxes' pid 1s outlive the helper that forks them: adopt them, so
   * that deleting a sandbox reaps its pid 1 at once. */
  prctl (PR_SET_CHILD_SUBREAPER, 1);
  /* Streams pass through in pieces of up to a few MiB, allocated and freed
   * at stream rate. Mapped and unmapped each time (or trimmed from the
   * heap at each free) every piece's pages were faulted in and zeroed
   * anew: a third of the gateway's time in a restore. So pieces up to
   * 4 MiB come from the heap, which keeps up to 8 MiB free at its top
   * before giving memory back: resident memory stays flat however much
   * data flows, a few MiB above the pieces in flight. Fixed values also
   * stop glibc from raising them on its own. */
  mallopt (M_MMAP_THRESHOLD, 4 * 1024 * 1024);
  mallopt (M_TRIM_THRESHOLD, 8 * 1024 * 1024);
  /* Descriptors are what a busy gateway runs out of first (every call,
   * pipe, snapshot stream): take the whole hard limit. */
  struct rlimit nofile;
  if (getrlimit (RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max)
    {
      nofile.rlim_cur = nofile.rlim_max;
      setrlimit (RLIMIT_NOFILE, &nofile);
    }
  /* Every sandbox command leads a session of its own, and with it (where
   * the scheduler groups by session) a CPU share of its own: the gateway,
   * which serves all of them, weighs as much as a few. Best effort. */
  FILE *ag = fopen ("/proc/self/autogroup", "we");
  if (ag != NULL)
    {
      fputs ("-5", ag);
      fclose (ag);
    }
}

/* SANDBOX_HEALTH_LISTEN: a second server, without TLS, on which only
 * grpc.health.v1.Health/Check is registered (every other method answers
 * UNIMPLEMENTED there), for probes that cannot speak TLS. It answers from
 * the same status as the main listener: NOT_SERVING once shutdown begins. */
static int
start_health_listener (gateway_t *g, err_t *err)
{
  const char *addr = g->cfg.health_listen;
  if (addr == NULL)
    return 0;
  rpc_opts_t opts = {
      .max_message_bytes = GW_HEALTH_MAX_MESSAGE_BYTES,
      .max_calls = GW_HEALTH_MAX_CALLS,
      .max_open_calls = GW_HEALTH_MAX_CALLS,
      .first_message_ms = GW_HEALTH_FIRST_MESSAGE_MS,
  };
  if (rpc_server_new (&opts, &g->health_server, err) < 0 || health_register_check (g->health_server, err) < 0)
    return -1;
  if (rpc_server_start (g->health_server, addr, &g->health_port, err) < 0)
    return err->status == EADDRINUSE ? err_wrap (err, "SANDBOX_HEALTH_LISTEN") : -1;
  return 0;
}

static int
start (gateway_t *g, err_t *err)
{
  const gw_config_t *c = &g->cfg;
  sbx_config_t rcfg;
  gw_config_runtime (c, &rcfg);
  rcfg.health = health_set_failing;
  if (sbx_runtime_new (&rcfg, &g->rt, err) < 0)
    return -1;
  store_choice_t choice = {
      .local_dir = c->snapshot_dir,
      .prefix = c->snapshot_prefix,
      .gcs_bucket = c->gcs_bucket,
      .gcs_emulator = c->gcs_emulator,
      .gcs_credentials = c->gcs_credentials,
      .gcs_metadata_host = c->gcs_metadata_host,
      .gcs_chunk_bytes = (size_t) c->gcs_chunk_mb * 1024 * 1024,
      .gcs_retry_ms = (unsigned) c->gcs_retry_seconds * 1000,
  };
  if (store_open (&choice, &g->store, err) < 0)
    return -1;
  /* An expired sandbox to persist first goes to the store, then goes. */
  sbx_set_expire_hook (g->rt, snap_expire, g->store);
  /* The same Google credentials as GCS, for Artifact Registry: no request
   * is made until a pull from one of its hosts asks for a token. */
  err_t gerr = ERR_INIT;
  if (gcs_tokens_new (c->gcs_credentials, c->gcs_metadata_host, &g->google, &gerr) < 0)
    err_warn_release (&gerr, "SANDBOX_REGISTRY_GOOGLE_HOSTS: no Google credentials (their registries are pulled "
                             "anonymously)");
  /* A sandbox's code contexts end with it, however it ends. */
  code_attach (g->rt);
  img_cache_opts_t io = {.state_dir = c->state_dir,
                         .auth_file = c->registry_auth_file,
                         .insecure_registries = c->insecure_registries,
                         .ca_file = c->registry_ca,
                         .rt = g->rt,
                         .cache_mb = c->image_cache_mb,
                         .store = g->store,
                         .google_hosts = c->registry_google_hosts,
                         .google_token = g->google != NULL ? google_token : NULL,
                         .google_token_put = gcs_tokens_put,
                         .google_ctx = g->google};
  if (img_cache_new (&io, &g->images, err) < 0)
    return err_wrap (err, "the image cache");
  rpc_opts_t opts = {
      .fixed_window = true,
      .max_message_bytes = (size_t) c->max_message_mb * 1024 * 1024,
      .max_calls = (size_t) c->max_calls,
      .max_open_calls = (size_t) c->max_open_calls,
      .first_message_ms = (int) c->first_message_seconds * 1000,
      .max_connections = (size_t) c->max_connections,
      .max_connections_per_peer = (size_t) c->max_connections_per_peer,
      .connection_idle_ms = (int) c->connection_idle_seconds * 1000,
      .tls_cert_file = c->tls_cert,
      .tls_key_file = c->tls_key,
      .tls_ca_file = c->tls_client_ca,
  };
  api_ctx_t ctx
      = {.secret = c->secret, .rt = g->rt, .store = g->store, .gateway_name = c->gateway_name, .images = g->images};
  if (rpc_server_new (&opts, &g->server, err) < 0 || api_register (g->server, &ctx, &g->api, err) < 0
      || health_register (g->server, served_services, err) < 0
      || reflection_register (g->server, gateway_descriptor_set, gateway_descriptor_set_len, err) < 0)
    return -1;
  /* Failing to bind is EADDRINUSE; with TLS, EINVAL is its credentials
   * (their files were checked at start, so it is their content). */
  if (rpc_server_start (g->server, c->listen, &g->port, err) < 0)
    {
      if (err->status == EADDRINUSE)
        return err_wrap (err, "SANDBOX_LISTEN");
      if (c->tls_cert != NULL && err->status == EINVAL)
        return err_wrap (err, "SANDBOX_TLS_CERT, SANDBOX_TLS_KEY");
      return -1;
    }
  return start_health_listener (g, err);
}

/* Frees what start made (any part of it). */
static void
stop (gateway_t *g)
{
  rpc_server_destroy (g->health_server);
  rpc_server_destroy (g->server);
  api_free (g->api);
  sbx_runtime_destroy (g->rt);
  img_cache_free (g->images);
  gcs_tokens_free (g->google);
  if (g->store != NULL)
    g->store->ops->destroy (g->store);
  reflection_release ();
  rpc_shutdown ();
  gw_config_release (&g->cfg);
}

/* The shutdown as it has always been: calls in flight get the whole grace,
 * then the sandboxes are deleted (by stop). */
static void
shut_down (gateway_t *g)
{
  int64_t rest_ms = rpc_server_drain (g->server, g->cfg.grace_seconds * 1000);
  sbx_runtime_stop (g->rt);
  rpc_server_shutdown (g->server, rest_ms);
}

/* SANDBOX_PERSIST_ON_SHUTDOWN: calls in flight get at most a quarter of the
 * grace, then every live sandbox is persisted within what is left of it;
 * the sandboxes are deleted afterwards (by stop) whatever the outcome.
 *
 * Why a quarter: a call still running is at most one command's worth of
 * work, which a client can run again; the sandboxes' files are all the
 * work done in them, and persisting them takes time in proportion to their
 * number and size, which a call's does not. The drain returns as soon as
 * calls are done, and the persist gets whatever it leaves. Calls that are
 * still running (an exec; a Delete, which the persist notices) go on while
 * sandboxes are persisted, each sandbox frozen while it is read, and are
 * cancelled once the persist is over; new sandbox calls are still answered
 * UNAVAILABLE "shutting down" meanwhile, and health keeps saying
 * NOT_SERVING. Launches in flight are stopped first, so that the list of
 * sandboxes to persist is final. */
/* Returns false when persists were left behind (still running on the
 * runtime): the runtime must then not be torn down under them. */
static bool
shut_down_persisting (gateway_t *g, int64_t signalled_ms)
{
  int64_t deadline_ms = signalled_ms + g->cfg.grace_seconds * 1000;
  int64_t rest_ms = rpc_server_drain (g->server, g->cfg.grace_seconds * 1000 / 4);
  sbx_runtime_stop (g->rt);
  snap_drain_result_t res = {0};
  snap_drain (g->rt, g->store, deadline_ms, &res);
  int64_t left_ms = deadline_ms - snap_drain_now_ms ();
  rpc_server_shutdown (g->server, rest_ms < left_ms ? rest_ms : (left_ms > 0 ? left_ms : 0));
  return res.left_behind == 0;
}

/* Past the grace, the shutdown's own work (cancelling calls, deleting the
 * sandboxes that are left, freeing) may take this long, plus
 * GW_SHUTDOWN_MS_PER_SANDBOX for each sandbox live at the signal; then the
 * gateway exits anyway (status 1). Its sandboxes' pid 1s end with it (they
 * watch the gateway), and the next start removes what they leave. */
#define GW_SHUTDOWN_MARGIN_MS 30000
#define GW_SHUTDOWN_MS_PER_SANDBOX 50

static void *
shutdown_deadline_main (void *arg)
{
  int64_t ms = *(int64_t *) arg;
  free (arg);
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
  while (clock_nanosleep (CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
  log_msg (SEV_ERROR, "shutdown: still running %d ms past the grace and its margin; exiting now",
           GW_SHUTDOWN_MARGIN_MS);
  _exit (1);
}

/* Arms the exit deadline of a shutdown signalled at `signalled_ms`. */
static void
arm_shutdown_deadline (const gateway_t *g, int64_t signalled_ms)
{
  int64_t *at = malloc (sizeof *at);
  if (at == NULL)
    return;
  *at = signalled_ms + g->cfg.grace_seconds * 1000 + GW_SHUTDOWN_MARGIN_MS
        + (int64_t) sbx_count (g->rt) * GW_SHUTDOWN_MS_PER_SANDBOX;
  pthread_t t;
  if (pthread_create (&t, NULL, shutdown_deadline_main, at) == 0)
    pthread_detach (t);
  else
    free (at);
}

/* The command line: -1 to go on, else the exit status (--help: 0). */
static int
parse_args (int argc, char **argv)
{
  for (int i = 1; i < argc; i++)
    {
      if (strcmp (argv[i], "--help") == 0 || strcmp (argv[i], "-h") == 0)
        {
          gw_config_print_help (stdout);
          return 0;
        }
      fprintf (stderr, "sandbox-gateway: unknown argument `%s` (see --help)\n", argv[i]);
      return 2;
    }
  return -1;
}

/* Warns when the open-file limit is below what SANDBOX_MAX sandboxes need. */
static void
warn_open_file_limit (const gateway_t *g)
{
  struct rlimit nofile;
  if (getrlimit (RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY
      && g->cfg.max_sandboxes * GW_FDS_PER_SANDBOX + GW_FDS_RESERVED > (long) nofile.rlim_cur)
    log_msg (SEV_WARNING,
             "SANDBOX_MAX %ld needs about %ld open files and this process may hold %ld: launches will fail "
             "before SANDBOX_MAX sandboxes live (raise the open-file limit or lower SANDBOX_MAX)",
             g->cfg.max_sandboxes, g->cfg.max_sandboxes * GW_FDS_PER_SANDBOX + GW_FDS_RESERVED,
             (long) nofile.rlim_cur);
}

static void
log_listening (const gateway_t *g)
{
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:i, s:b, s:s, s:b}", "address", g->cfg.listen, "port", g->port, "tls",
                         g->cfg.tls_cert != NULL, "gateway_name", g->cfg.gateway_name, "persist_on_shutdown",
                         g->cfg.persist_on_shutdown),
              "listening");
  if (g->health_server != NULL)
    log_fields (SEV_INFO, json_pack ("{s:s, s:i}", "address", g->cfg.health_listen, "port", g->health_port),
                "health listener (plaintext, Check only)");
}

int
main (int argc, char **argv)
{
  log_set_program ("sandbox-gateway");
  int rc = parse_args (argc, argv);
  if (rc >= 0)
    return rc;

  gateway_t g = {0};
  err_t err = ERR_INIT;
  if (gw_config_load (&g.cfg, &err) < 0 || gw_config_check_files (&g.cfg, &err) < 0)
    {
      log_msg (SEV_ERROR, "configuration: %s", err_msg (&err));
      err_release (&err);
      gw_config_release (&g.cfg);
      return 2;
    }
  if (g.cfg.secret == NULL)
    log_msg (SEV_WARNING, "CLOUD_RUN_SANDBOX_GATEWAY_SECRET is not set: every sandbox call will fail UNAVAILABLE");

  sigset_t sigs;
  set_up_process (&sigs);
  warn_open_file_limit (&g);
  rpc_init ();
  if (start (&g, &err) < 0)
    {
      log_msg (SEV_ERROR, "start: %s", err_msg (&err));
      err_release (&err);
      stop (&g);
      return 1;
    }
  log_listening (&g);

  int sig = 0;
  sigwait (&sigs, &sig);
  int64_t signalled_ms = snap_drain_now_ms ();
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:i, s:b}", "signal", strsignal (sig), "grace_seconds", (int) g.cfg.grace_seconds,
                         "persist_on_shutdown", g.cfg.persist_on_shutdown),
              "shutting down");
  /* Health turns NOT_SERVING at once (load balancers stop sending); new
   * sandbox calls are answered UNAVAILABLE "shutting down" while those in
   * flight finish, for up to the grace (or a part of it, see
   * shut_down_persisting); what is left of it goes to the rest (health
   * Watch, reflection), then anything still running is cancelled. The exit
   * status is 0 even when persists failed: each failure is logged as an
   * error, and a restart would not bring the sandboxes back. */
  arm_shutdown_deadline (&g, signalled_ms);
  health_shutdown ();
  if (g.cfg.persist_on_shutdown && !shut_down_persisting (&g, signalled_ms))
    {
      /* A persist still runs on the runtime: tearing it down would free
       * what that persist uses. Exit now; the sandboxes' pid 1s end with
       * the gateway and the next start removes what is left. */
      log_msg (SEV_ERROR, "shutdown: persists left behind; exiting without tearing the runtime down");
      _exit (1);
    }
  if (!g.cfg.persist_on_shutdown)
    shut_down (&g);
  stop (&g);
  log_msg (SEV_INFO, "stopped");
  return 0;
}
