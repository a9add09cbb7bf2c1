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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rpc.h"
#include "gateway/health.h"
#include "gateway/reflection.h"
#include "gateway/service.h"

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
  if (strrchr (cfg.listen, ':') == NULL)
    return err_make (err, EINVAL, "SANDBOX_LISTEN: `%s` is not host:port", cfg.listen);
  if ((cfg.tls_cert != NULL) != (cfg.tls_key != NULL))
    return err_make (err, EINVAL, "SANDBOX_TLS_CERT and SANDBOX_TLS_KEY must be set together");
  if (cfg.tls_client_ca != NULL && cfg.tls_cert == NULL)
    return err_make (err, EINVAL, "SANDBOX_TLS_CLIENT_CA needs SANDBOX_TLS_CERT and SANDBOX_TLS_KEY");
  return 0;
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

  rpc_init ();
  rpc_opts_t opts = {
      .max_message_bytes = (size_t) cfg.max_message_mb * 1024 * 1024,
      .tls_cert_file = cfg.tls_cert,
      .tls_key_file = cfg.tls_key,
      .tls_ca_file = cfg.tls_client_ca,
  };
  rpc_server_t *server = NULL;
  int port = 0;
  int rc = rpc_server_new (&opts, &server, &err);
  if (rc == 0)
    rc = service_register (server, cfg.secret, &err);
  if (rc == 0)
    rc = health_register (server, served_services, &err);
  if (rc == 0)
    rc = reflection_register (server, gateway_descriptor_set, gateway_descriptor_set_len, &err);
  if (rc == 0)
    rc = rpc_server_start (server, cfg.listen, &port, &err);
  if (rc < 0)
    {
      log_msg (SEV_ERROR, "start: %s", err_msg (&err));
      err_release (&err);
      rpc_server_destroy (server);
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
  rpc_server_shutdown (server, cfg.grace_seconds * 1000);
  rpc_server_destroy (server);
  reflection_release ();
  rpc_shutdown ();
  log_msg (SEV_INFO, "stopped");
  return 0;
}
