/* sandbox-shim: the HTTP server that serves the existing REST contract and
 * translates it into gRPC calls to sandbox-gateway.
 *
 * main() reads the configuration from the environment (see --help), opens
 * the channel to the gateway, starts the HTTP server and stops on SIGTERM
 * or SIGINT (no new connections; requests in flight end with the daemon).
 *
 * Threading: signals are blocked before any thread starts and taken with
 * sigwait() on the main thread.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "common/tls_files.h"
#include "shim/members.h"
#include "shim/shim.h"
#include "shim/target.h"

struct MHD_Daemon *shim_server_start (const struct sockaddr *addr, err_t *err);

static const cfg_var_t shim_vars[] = {
    {"SHIM_HOST", CFG_STRING, "127.0.0.1", "address to listen on (containers: 0.0.0.0)", 0, 0, &shim.cfg.host, NULL,
     false},
    {"PORT", CFG_INT, "8080", "port to listen on", 1, 65535, &shim.cfg.port, NULL, false},
    {"CLOUD_RUN_SANDBOX_GATEWAY_SECRET", CFG_STRING, NULL,
     "bearer secret clients must present; unset: every endpoint but /health answers 503", 0, 0, &shim.cfg.secret,
     NULL, true},
    {"SHIM_GATEWAY_TARGET", CFG_STRING, "127.0.0.1:50051",
     "the gateway's gRPC address: host:port, [IPv6]:port, dns:[//authority/]host:port, ipv4:addr:port, "
     "ipv6:[addr]:port, unix:path or unix-abstract:name",
     0, 0, &shim.cfg.gateway_target, NULL, false},
    {"SHIM_GATEWAYS", CFG_STRING, NULL,
     "several gateways, each sandbox id routed to its owner (rendezvous hashing): a comma list of gateway "
     "addresses, or dns-srv:<name> (the SRV records of a headless Service's port); unset: SHIM_GATEWAY_TARGET alone",
     0, 0, &shim.cfg.gateways, NULL, false},
    {"SHIM_GATEWAYS_REFRESH_SECONDS", CFG_INT, "10", "how often a dns-srv: gateway set is resolved again", 1, 3600,
     &shim.cfg.gateways_refresh, NULL, false},
    {"SHIM_GATEWAYS_HEALTH_SECONDS", CFG_INT, "2",
     "how often each gateway of SHIM_GATEWAYS gets a health check (one that fails is out of the set until one "
     "passes)",
     1, 60, &shim.cfg.gateways_health, NULL, false},
    {"SHIM_GATEWAY_SECRET", CFG_STRING, NULL, "bearer secret sent to the gateway", 0, 0, &shim.cfg.gateway_secret,
     "CLOUD_RUN_SANDBOX_GATEWAY_SECRET", true},
    {"SHIM_RESTORE_ON_MISS", CFG_BOOL, "false",
     "a call about a sandbox its gateway does not hold, but the snapshot store does, restores it there first "
     "(without egress); false: 404, as the contract has it",
     0, 0, &shim.cfg.restore_on_miss, NULL, false},
    {"SHIM_MAX_EXEC_OUTPUT", CFG_INT, "67108864",
     "bytes of stdout (and of stderr) an exec answer keeps; past it, \"truncated\": true", 1024, 1073741824,
     &shim.cfg.max_exec_output, NULL, false},
    {"SHIM_MAX_BUFFERED_OUTPUT", CFG_INT, "1073741824",
     "bytes all buffered exec answers may hold at once (their output as base64: 4/3 of its size); an exec that "
     "would pass it is cancelled and answers 503",
     65536, 1099511627776L, &shim.cfg.max_buffered_output, NULL, false},
    {"SHIM_MAX_RESTORE_BYTES", CFG_INT, "4294967296", "largest restore body; above it: 413", 1024, 1099511627776L,
     &shim.cfg.max_restore_bytes, NULL, false},
    {"SHIM_MAX_CONNECTIONS", CFG_INT, "1024",
     "most simultaneous HTTP connections (a descriptor and up to 256 KiB each, no thread); from 7/8 of it on, "
     "connections waiting for a request (idle keep-alive first) are closed, and answers close theirs",
     4, 100000, &shim.cfg.max_connections, NULL, false},
    {"SHIM_MAX_CONNECTIONS_PER_CLIENT", CFG_INT, "256",
     "most simultaneous HTTP connections from one client address (behind a proxy every client has the proxy's: "
     "raise it, or 0 for no cap); beyond, new ones are closed at once",
     0, 100000, &shim.cfg.max_connections_per_client, NULL, false},
    {"SHIM_MAX_WORKERS", CFG_INT, "256",
     "most requests worked on at once (a thread each: a route's gateway calls, a streamed body or answer's next "
     "piece); beyond, requests wait for one in order, at most 10 s, then 503",
     1, 100000, &shim.cfg.max_workers, NULL, false},
    {"SHIM_MAX_TERMINALS", CFG_INT, "256",
     "most WebSocket terminals open at once (each also holds one of SHIM_MAX_CONNECTIONS); beyond: 429", 1, 100000,
     &shim.cfg.max_terminals, NULL, false},
    {"SHIM_CONNECTION_TIMEOUT", CFG_INT, "120", "seconds an idle HTTP connection is kept", 1, 86400,
     &shim.cfg.connection_timeout, NULL, false},
    {"SHIM_HEADER_TIMEOUT", CFG_INT, "10",
     "seconds a request's head may take to arrive (also ends idle keep-alive connections)", 1, 3600,
     &shim.cfg.header_timeout, NULL, false},
    {"SHIM_BODY_TIMEOUT", CFG_INT, "10",
     "seconds a JSON body may take; a restore body must keep SHIM_MIN_UPLOAD_RATE after it", 1, 3600,
     &shim.cfg.body_timeout, NULL, false},
    {"SHIM_MIN_UPLOAD_RATE", CFG_INT, "16384", "least average bytes per second of a restore body", 0, 1073741824,
     &shim.cfg.min_upload_rate, NULL, false},
    {"SHIM_GATEWAY_TLS", CFG_BOOL, "false", "speak TLS to the gateway", 0, 0, &shim.cfg.gateway_tls, NULL, false},
    {"SHIM_GATEWAY_TLS_CA", CFG_STRING, NULL,
     "PEM roots to verify the gateway with (needs SHIM_GATEWAY_TLS); unset: the system's", 0, 0,
     &shim.cfg.gateway_tls_ca, NULL, false},
    {"SHIM_GATEWAY_TLS_CERT", CFG_STRING, NULL,
     "PEM client certificate for mutual TLS (needs SHIM_GATEWAY_TLS and SHIM_GATEWAY_TLS_KEY)", 0, 0,
     &shim.cfg.gateway_tls_cert, NULL, false},
    {"SHIM_GATEWAY_TLS_KEY", CFG_STRING, NULL,
     "PEM key of SHIM_GATEWAY_TLS_CERT (needs SHIM_GATEWAY_TLS and SHIM_GATEWAY_TLS_CERT)", 0, 0,
     &shim.cfg.gateway_tls_key, NULL, false},
    {"SHIM_GATEWAY_TLS_SERVER_NAME", CFG_STRING, NULL,
     "name to verify the gateway's certificate against (needs SHIM_GATEWAY_TLS)", 0, 0,
     &shim.cfg.gateway_tls_server_name, NULL, false},
    {"SHIM_MAX_FORWARDS", CFG_INT, "512",
     "most connections the port proxy and preview links forward into sandboxes at once (WebSockets included; each "
     "also holds one of SHIM_MAX_CONNECTIONS); beyond: 429",
     1, 100000, &shim.cfg.max_forwards, NULL, false},
    {"SHIM_MAX_FORWARDS_PER_SANDBOX", CFG_INT, "64",
     "most forwarded connections into one sandbox at once; beyond: 429", 1, 100000,
     &shim.cfg.max_forwards_per_sandbox, NULL, false},
    {"SHIM_FORWARD_IDLE_SECONDS", CFG_INT, "300",
     "seconds a forwarded connection may move no byte either way (a server that sends nothing, or a client that "
     "reads nothing) before it is cut (504 when the server had not begun its answer)",
     1, 86400, &shim.cfg.forward_idle_seconds, NULL, false},
    {"SHIM_PREVIEW_MAX_TTL_SECONDS", CFG_INT, "604800",
     "longest lifetime a preview link may be given (a link asked for without ttl_seconds: 3600, or this when "
     "shorter)",
     1, 31536000, &shim.cfg.preview_max_ttl, NULL, false},
    {"SHIM_PUBLIC_URL", CFG_STRING, NULL,
     "the shim's public base URL for preview links (e.g. https://preview.example.com); unset: http:// and the Host "
     "header of the request that asks for the link",
     0, 0, &shim.cfg.public_url, NULL, false},
    {"SHIM_LOG_LEVEL", CFG_STRING, "info", "lowest log severity written: debug, info, warning or error", 0, 0,
     &shim.cfg.log_level, NULL, false},
    {"SHIM_MAX_FILE_UPLOAD_BYTES", CFG_INT, "4294967296",
     "largest file body (PUT /sandboxes/{id}/files); above it: 413 (the sandbox's disk quota may stop it sooner: "
     "507)",
     1024, 1099511627776L, &shim.cfg.max_file_upload_bytes, NULL, false},
    {"SHIM_MAX_PROXY_BODY_BYTES", CFG_INT, "4294967296",
     "largest request body the port proxy and preview links forward into a sandbox; above it: 413", 1024,
     1099511627776L, &shim.cfg.max_proxy_body_bytes, NULL, false},
};

/* How long a stopping shim waits for the requests being answered. */
#define SHIM_STOP_WAIT_MS 10000

#define N_VARS (sizeof shim_vars / sizeof shim_vars[0])

static const char usage[] = "Usage: sandbox-shim [--help]\n\n"
                            "Serves the sandbox REST contract over HTTP and translates it into gRPC calls\n"
                            "to sandbox-gateway. Configuration comes from the environment only.";

/* The gateway's address and the TLS settings of the hop to it: what gRPC
 * would only find out when connecting (again and again) is refused here. */
static int
check_gateway_config (err_t *err)
{
  const shim_config_t *c = &shim.cfg;
  const char *why = members_check_spec (c->gateways);
  if (why != NULL)
    return err_make (err, EINVAL, "SHIM_GATEWAYS: `%s`: %s", c->gateways, why);
  if (c->gateways != NULL && getenv ("SHIM_GATEWAY_TARGET") != NULL && getenv ("SHIM_GATEWAY_TARGET")[0] != '\0')
    return err_make (err, EINVAL, "SHIM_GATEWAYS and SHIM_GATEWAY_TARGET are both set: name the gateways in one");
  if (!shim_target_valid (c->gateway_target))
    return err_make (err, EINVAL,
                     "SHIM_GATEWAY_TARGET: `%s` is not host:port, dns:[//authority/]host:port, ipv4:addr:port, "
                     "ipv6:[addr]:port, unix:path or unix-abstract:name (port 1..65535)",
                     c->gateway_target);
  if (c->gateway_tls_cert != NULL && c->gateway_tls_key == NULL)
    return err_make (err, EINVAL, "SHIM_GATEWAY_TLS_CERT is set without SHIM_GATEWAY_TLS_KEY");
  if (c->gateway_tls_key != NULL && c->gateway_tls_cert == NULL)
    return err_make (err, EINVAL, "SHIM_GATEWAY_TLS_KEY is set without SHIM_GATEWAY_TLS_CERT");
  const char *const tls_vars[][2] = {
      {"SHIM_GATEWAY_TLS_CA", c->gateway_tls_ca},
      {"SHIM_GATEWAY_TLS_CERT", c->gateway_tls_cert},
      {"SHIM_GATEWAY_TLS_KEY", c->gateway_tls_key},
      {"SHIM_GATEWAY_TLS_SERVER_NAME", c->gateway_tls_server_name},
  };
  for (size_t i = 0; i < sizeof tls_vars / sizeof tls_vars[0]; i++)
    if (tls_vars[i][1] != NULL && !c->gateway_tls)
      return err_make (err, EINVAL, "%s is set but SHIM_GATEWAY_TLS is false (it would be ignored)", tls_vars[i][0]);
  tls_files_t files = {
      .cert_var = "SHIM_GATEWAY_TLS_CERT",
      .cert = c->gateway_tls_cert,
      .key_var = "SHIM_GATEWAY_TLS_KEY",
      .key = c->gateway_tls_key,
      .ca_var = "SHIM_GATEWAY_TLS_CA",
      .ca = c->gateway_tls_ca,
  };
  return tls_files_check (&files, err);
}

/* Reads and checks the environment into shim.cfg. */
static int
load_config (err_t *err)
{
  if (cfg_load (shim_vars, N_VARS, err) < 0)
    return -1;
  log_level_t level;
  if (log_parse_level (shim.cfg.log_level, &level) < 0)
    return err_make (err, EINVAL, "SHIM_LOG_LEVEL: `%s` is not one of debug, info, warning, error",
                     shim.cfg.log_level);
  log_set_level (level);
  return check_gateway_config (err);
}

/* SHIM_HOST and PORT as a socket address. */
static int
listen_address (struct sockaddr_storage *ss, err_t *err)
{
  memset (ss, 0, sizeof *ss);
  struct sockaddr_in *in4 = (struct sockaddr_in *) ss;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *) ss;
  if (inet_pton (AF_INET, shim.cfg.host, &in4->sin_addr) == 1)
    {
      in4->sin_family = AF_INET;
      in4->sin_port = htons ((uint16_t) shim.cfg.port);
      return 0;
    }
  if (inet_pton (AF_INET6, shim.cfg.host, &in6->sin6_addr) == 1)
    {
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons ((uint16_t) shim.cfg.port);
      return 0;
    }
  return err_make (err, EINVAL, "SHIM_HOST: `%s` is not an IPv4 or IPv6 address", shim.cfg.host);
}

/* Process-wide settings made before any thread starts. */
static void
set_up_process (sigset_t *sigs)
{
  sigemptyset (sigs);
  sigaddset (sigs, SIGTERM);
  sigaddset (sigs, SIGINT);
  pthread_sigmask (SIG_BLOCK, sigs, NULL);
  signal (SIGPIPE, SIG_IGN);
  /* Streams pass through in pieces of up to a few MiB, allocated and freed
   * at stream rate: mapped and unmapped each time, every piece's pages were
   * faulted in and zeroed anew (the port proxy moved 0.55x the in-sandbox
   * fetch that way, 0.70-0.75x from the heap). So pieces up to 4 MiB come
   * from the heap, which gives back what is free at its top past 1 MiB:
   * with many connections each thread's arena keeps little (the buffered
   * exec's peak stays at 1.4x the output in flight), and resident memory
   * stays flat however much data flows. Fixed values also stop glibc from
   * raising them on its own. */
  mallopt (M_MMAP_THRESHOLD, 4 * 1024 * 1024);
  mallopt (M_TRIM_THRESHOLD, 1024 * 1024);
}

/* Opens the channel to the gateway, then serves HTTP. */
static struct MHD_Daemon *
start (const struct sockaddr_storage *ss, err_t *err)
{
  rpc_opts_t opts = {
      .fixed_window = true,
      .tls = shim.cfg.gateway_tls,
      .tls_ca_file = shim.cfg.gateway_tls_ca,
      .tls_cert_file = shim.cfg.gateway_tls_cert,
      .tls_key_file = shim.cfg.gateway_tls_key,
      .tls_server_name = shim.cfg.gateway_tls_server_name,
      .max_message_bytes = 64u * 1024 * 1024,
  };
  if (shim.cfg.gateway_secret != NULL && asprintf (&shim.auth_header, "Bearer %s", shim.cfg.gateway_secret) >= 0)
    {
      shim.md[0] = (rpc_metadata_t){"authorization", shim.auth_header};
      shim.n_md = 1;
    }
  members_config_t mc = {
      .gateways = shim.cfg.gateways,
      .target = shim.cfg.gateway_target,
      .refresh_seconds = shim.cfg.gateways_refresh,
      .health_seconds = shim.cfg.gateways_health,
      .opts = &opts,
      .md = shim.md,
      .n_md = shim.n_md,
  };
  if (members_start (&mc, err) < 0 || hangup_start (err) < 0)
    return NULL;
  return shim_server_start ((const struct sockaddr *) ss, err);
}

int
main (int argc, char **argv)
{
  log_set_program ("sandbox-shim");
  for (int i = 1; i < argc; i++)
    {
      if (strcmp (argv[i], "--help") == 0 || strcmp (argv[i], "-h") == 0)
        {
          cfg_print_help (stdout, usage, shim_vars, N_VARS);
          return 0;
        }
      fprintf (stderr, "sandbox-shim: unknown argument `%s` (see --help)\n", argv[i]);
      return 2;
    }
  cleanup_err err_t err = ERR_INIT;
  struct sockaddr_storage ss;
  if (load_config (&err) < 0 || listen_address (&ss, &err) < 0)
    {
      log_msg (SEV_ERROR, "configuration: %s", err_msg (&err));
      return 2;
    }
  if (shim.cfg.secret == NULL)
    log_msg (SEV_WARNING, "CLOUD_RUN_SANDBOX_GATEWAY_SECRET is not set: every endpoint but /health answers 503");

  sigset_t sigs;
  set_up_process (&sigs);
  rpc_init ();
  struct MHD_Daemon *d = start (&ss, &err);
  if (d == NULL)
    {
      log_msg (SEV_ERROR, "start: %s", err_msg (&err));
      members_stop ();
      rpc_shutdown ();
      return 1;
    }
  log_fields (SEV_INFO,
              json_pack ("{s:s, s:i, s:s}", "host", shim.cfg.host, "port", (int) shim.cfg.port, "gateway",
                         shim.cfg.gateways != NULL ? shim.cfg.gateways : shim.cfg.gateway_target),
              "listening");
  int sig = 0;
  sigwait (&sigs, &sig);
  log_fields (SEV_INFO, json_pack ("{s:s}", "signal", strsignal (sig)), "shutting down");
  terminal_stop_all ();
  /* No new connections; the requests being worked on get SHIM_STOP_WAIT_MS
   * to end (those waiting for a worker are answered 503). A daemon with a
   * request still on a worker (a long exec) cannot be stopped under it:
   * the process then ends with it. */
  MHD_socket lsock = MHD_quiesce_daemon (d);
  if (lsock != MHD_INVALID_SOCKET)
    close (lsock);
  if (!workers_stop (SHIM_STOP_WAIT_MS) || !shim_none_suspended (1000))
    {
      log_msg (SEV_WARNING, "stopped with %zu requests still being answered", workers_running ());
      return 0;
    }
  MHD_stop_daemon (d);
  members_stop ();
  rpc_shutdown ();
  free (shim.auth_header);
  log_msg (SEV_INFO, "stopped");
  return 0;
}
